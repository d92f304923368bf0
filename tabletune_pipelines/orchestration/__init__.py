"""The Dagster layer: resources, partitions, jobs, schedules, sensors, run tags, the code location
(``definitions``) and the in-process main command (``embedded``). The only package of
``tabletune_pipelines`` that imports dagster; the asset definitions are in the top-level ``assets``."""
