"""The Dagster layer's library: resources, partitions, jobs, schedules, sensors, run tags and the UI's
metadata. The assets are in ``tabletune_pipelines/defs/``, the code location in
``tabletune_pipelines/definitions.py`` and the in-process main command in ``tabletune_pipelines/embedded.py``;
with those, the only modules of ``tabletune_pipelines`` that import dagster."""
