"""ServerConfig: validation names the bad value; the speculative config it writes."""

from __future__ import annotations

import pytest

from tabletune_pipelines.engine.config import OWNED_SPECULATIVE_KEYS, ServerConfig
from tabletune_pipelines.errors import EngineConfigError, TableTuneError

SPEC = {"model": "/m", "drafter": "/d", "method": "draft_model", "num_speculative_tokens": 3}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"drafter": "/d", "method": "draft_model", "num_speculative_tokens": 0}, "num_speculative_tokens = 0"),
    ({"method": "medusa2", "num_speculative_tokens": 2}, "method = 'medusa2'"),
    ({"drafter": "/d", "method": "draft_model", "num_speculative_tokens": 2, "synthetic_acceptance_rates": (0.5, 0.6)},
     "a_2 = 0.6"),
    ({"drafter": "/d", "method": "draft_model", "num_speculative_tokens": 2, "synthetic_acceptance_rates": (0.5,)},
     "has 1 entries"),
    ({"drafter": "/d", "method": "draft_model", "num_speculative_tokens": 2, "synthetic_acceptance_rates": (1.5, 0.1)},
     "a_1 = 1.5 is outside"),
    ({"drafter": "/d", "method": "draft_model", "num_speculative_tokens": 2, "table": ((2, 8, 1),)}, "table"),
    ({"drafter": "/d", "method": "draft_model", "num_speculative_tokens": 2, "table": ((1, 8, 3),)},
     r"asks k = 3 > num_speculative_tokens = 2"),
    ({"device": "tpu"}, "device = 'tpu'"),
    ({"max_num_seqs": 0}, "max_num_seqs = 0"),
    ({"max_model_len": True}, "max_model_len = True"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "drafter = None"),
    ({"method": "ngram", "num_speculative_tokens": 2, "drafter": "/d"}, "n-gram drafting takes no draft model"),
    ({"num_speculative_tokens": 2}, "needs a speculative method"),
    ({"startup_timeout": 0}, "startup_timeout = 0"),
    ({"port": 70000}, "port = 70000"),
    ({"dtype": ""}, "dtype = ''"),
    ({"dtype": 3}, "dtype = 3"),
    ({"model_runner": "v3"}, "model_runner = 'v3'"),
    ({"load_format": " "}, "load_format = ' '"),
    ({"vllm_cli": ()}, r"vllm_cli = \(\)"),
    ({"vllm_cli": ("serve",)}, "vllm_cli"),
])
def test_validation_names_the_bad_value(kwargs, message):
    with pytest.raises(EngineConfigError, match=message):
        ServerConfig(**{"model": "/m", **kwargs})


def test_errors_are_tabletune_errors():
    assert issubclass(EngineConfigError, TableTuneError)
    with pytest.raises(EngineConfigError, match="model = ''"):
        ServerConfig(model="")


def test_speculative_extra_cannot_override_owned_keys():
    for key in OWNED_SPECULATIVE_KEYS:
        with pytest.raises(EngineConfigError, match=key):
            ServerConfig(model="/m", method="ngram", num_speculative_tokens=3, speculative_extra={key: 1})


def test_speculative_config_from_typed_fields():
    cfg = ServerConfig(**SPEC, table=((8, 16, 1), (1, 7, 3)), synthetic_acceptance_rates=(0.7, 0.5, 0.3),
                       speculative_extra={"prompt_lookup_max": 4})
    assert cfg.table == ((1, 7, 3), (8, 16, 1))  # sorted like vLLM's validator
    assert cfg.speculative_config == {
        "method": "draft_model", "num_speculative_tokens": 3, "model": "/d",
        "num_speculative_tokens_per_batch_size": [[1, 7, 3], [8, 16, 1]],
        "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.7, 0.5, 0.3],
        "prompt_lookup_max": 4}
    assert ServerConfig(model="/m").speculative_config is None
    assert ServerConfig(model="/m", device="gpu").dtype == "bfloat16"  # None resolves to the device's default
    assert ServerConfig(model="/m", dtype="float16").dtype == "float16"


def test_load_format_also_loads_a_model_drafter_that_way():
    eagle = ServerConfig(model="/m", drafter="/h", method="eagle3", num_speculative_tokens=3, load_format="dummy")
    assert eagle.speculative_config["draft_load_config"] == {"load_format": "dummy"}
    ngram = ServerConfig(model="/m", method="ngram", num_speculative_tokens=3, load_format="dummy")
    assert "draft_load_config" not in ngram.speculative_config
    with pytest.raises(EngineConfigError, match="draft_load_config"):
        ServerConfig(model="/m", drafter="/h", method="eagle3", num_speculative_tokens=3, load_format="dummy",
                     speculative_extra={"draft_load_config": {"load_format": "auto"}})
    # Without load_format, a deployment's own draft_load_config passes through.
    own = ServerConfig(model="/m", drafter="/h", method="eagle3", num_speculative_tokens=3,
                       speculative_extra={"draft_load_config": {"load_format": "dummy"}})
    assert own.speculative_config["draft_load_config"] == {"load_format": "dummy"}


def test_vllm_cli_is_normalised_to_strings():
    cfg = ServerConfig(model="/m", vllm_cli=["python3", "-m", "vllm.entrypoints.cli.main", "serve"])
    assert cfg.vllm_cli == ("python3", "-m", "vllm.entrypoints.cli.main", "serve")
