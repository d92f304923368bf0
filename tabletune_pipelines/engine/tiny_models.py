"""Tiny local models for the embedded default: no model hub, everything made here
(docs/engine-facts.md, "CPU build").

``ensure_tiny_models(cache_dir, size)`` builds, once, with fixed seeds:

* a byte-level BPE tokenizer trained with ``tokenizers`` on a generated corpus;
* a random-weight Llama target (``small``: 4 layers, hidden 512, ≈14 M parameters;
  ``medium``: 12 layers, hidden 1024, ≈146 M parameters);
* a 1-layer hidden-256 Llama draft model sharing the tokenizer (same vocabulary).

Each is saved with ``transformers`` (safetensors) in the dtype the launches will use, so vLLM loads
it without conversion: by default the device's (``engine/dtype.py``: bfloat16 on a CPU with native
bf16, else float32), in its own folder ``cache_dir/<size>-v<recipe>-<dtype>``. A marker file is
written last: a half-built folder (crash, Ctrl-C) has no marker and is rebuilt from scratch on the
next call. Built folders are reused as they are.

The heavy imports (torch, transformers, tokenizers) happen inside the functions, so importing
this module is cheap.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tabletune_pipelines.errors import EngineConfigError

#: Bump when the recipe changes: a cache built by another recipe is rebuilt.
RECIPE_VERSION = 2
#: The dtypes a set can be saved in (the names vLLM's ``--dtype`` and ``torch_dtype`` use).
SAVE_DTYPES = ("bfloat16", "float32", "float16")
MARKER = "TABLETUNE_TINY_MODELS_OK"
SEED = 20240611

VOCAB_SIZE = 2048
MAX_POSITION_EMBEDDINGS = 2048

#: Architectures per size: (layers, hidden, intermediate, heads).
TARGET_SHAPES: dict[str, tuple[int, int, int, int]] = {
    "small": (4, 512, 1376, 8),
    "medium": (12, 1024, 2816, 16),
}
DRAFT_SHAPE = (1, 256, 688, 4)


@dataclass(frozen=True)
class TinyModels:
    """Paths of a built model set."""

    root: Path
    """The folder holding the set (``cache_dir/<size>-v<recipe>-<dtype>``)."""
    target_dir: Path
    """Target model folder (config, safetensors, tokenizer)."""
    draft_dir: Path
    """Draft model folder (same tokenizer and vocabulary as the target)."""
    size: str
    """``small`` or ``medium``."""
    vocab_size: int
    """Vocabulary size shared by target and draft."""
    dtype: str = "bfloat16"
    """The dtype the weights are saved in (and ``config.json``'s ``torch_dtype``)."""


def _words(rng: random.Random, n: int) -> list[str]:
    onsets = ["b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "ch", "sh"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    codas = ["", "", "n", "r", "s", "t", "l", "nd", "ck"]
    out = []
    for _ in range(n):
        syl = rng.randint(1, 3)
        out.append("".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(syl)))
    return out


def generate_corpus(num_lines: int = 4000, seed: int = SEED) -> list[str]:
    """A deterministic English-like corpus (made-up words, digits, punctuation, some code)."""
    rng = random.Random(seed)
    lexicon = _words(rng, 1500) + ["the", "a", "of", "and", "to", "in", "is", "it", "for", "on"] * 20
    lines = []
    for i in range(num_lines):
        kind = i % 5
        if kind == 3:
            name = rng.choice(lexicon)
            lines.append(f"def {name}(x, y):\n    return x * {rng.randint(0, 99)} + y  # {rng.choice(lexicon)}")
        else:
            n = rng.randint(6, 30)
            sent = " ".join(rng.choice(lexicon) for _ in range(n))
            lines.append(sent.capitalize() + rng.choice([".", "?", "!", ",", ";"]) + f" {rng.randint(0, 9999)}")
    return lines


def _train_tokenizer(out_dir: Path, vocab_size: int) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(generate_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        model_max_length=MAX_POSITION_EMBEDDINGS,
    )
    fast.save_pretrained(out_dir)
    return tok.get_vocab_size()


def _save_llama(out_dir: Path, shape: tuple[int, int, int, int], vocab_size: int, seed: int, tok_dir: Path,
                dtype: str) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden, inter, heads = shape
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        initializer_range=0.02,
    )
    torch.manual_seed(seed)
    # Initialised in float32 and cast: the same seed gives the same weights up to rounding in every dtype.
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in os.listdir(tok_dir):
        shutil.copy2(tok_dir / name, out_dir / name)
    # vLLM reads the dtype from the config; make it explicit.
    cfg_path = out_dir / "config.json"
    data = json.loads(cfg_path.read_text())
    data["torch_dtype"] = dtype
    cfg_path.write_text(json.dumps(data, indent=2, sort_keys=True))


def ensure_tiny_models(cache_dir: str | os.PathLike[str], size: str = "small", dtype: str | None = None) -> TinyModels:
    """Build (once) and return the tiny target + draft model set of ``size``, saved in ``dtype``
    (None: the default dtype of this machine's device, ``engine/dtype.py``).

    Deterministic: the same recipe gives the same tokenizer and weights. A set is reused only if
    its marker file exists (written last), otherwise the folder is rebuilt from scratch.
    """
    if size not in TARGET_SHAPES:
        raise EngineConfigError(f"size = {size!r} is not a tiny model size; choose one of {sorted(TARGET_SHAPES)}")
    if dtype is None:
        from tabletune_pipelines.engine.dtype import default_dtype
        from tabletune_pipelines.engine.installed import resolve_device

        dtype = default_dtype(resolve_device("auto"))
    if dtype not in SAVE_DTYPES:
        raise EngineConfigError(
            f"dtype = {dtype!r} is not a dtype tiny models are saved in; choose one of {SAVE_DTYPES}")
    cache = Path(cache_dir).expanduser().resolve()
    root = cache / f"{size}-v{RECIPE_VERSION}-{dtype}"
    marker = root / MARKER
    if marker.exists():
        info = json.loads(marker.read_text())
        return TinyModels(root=root, target_dir=root / "target", draft_dir=root / "draft", size=size,
                          vocab_size=int(info["vocab_size"]), dtype=dtype)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{size}-building-", dir=cache))
    os.chmod(tmp, 0o755)
    try:
        tok_dir = tmp / "tokenizer"
        tok_dir.mkdir()
        vocab = _train_tokenizer(tok_dir, VOCAB_SIZE)
        (tmp / "target").mkdir()
        (tmp / "draft").mkdir()
        _save_llama(tmp / "target", TARGET_SHAPES[size], vocab, SEED + 1, tok_dir, dtype)
        _save_llama(tmp / "draft", DRAFT_SHAPE, vocab, SEED + 2, tok_dir, dtype)
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    info = {"recipe": RECIPE_VERSION, "size": size, "vocab_size": vocab, "dtype": dtype,
            "target": TARGET_SHAPES[size], "draft": DRAFT_SHAPE, "seed": SEED}
    tmp_marker = root / (MARKER + ".tmp")
    tmp_marker.write_text(json.dumps(info))
    os.replace(tmp_marker, marker)
    return TinyModels(root=root, target_dir=root / "target", draft_dir=root / "draft", size=size, vocab_size=vocab,
                      dtype=dtype)


def read_vocab_size(model_dir: str | os.PathLike[str]) -> int | None:
    """``vocab_size`` from a local model folder's config.json (None if not readable)."""
    path = Path(model_dir) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    v = data.get("vocab_size")
    if v is None and isinstance(data.get("text_config"), dict):
        v = data["text_config"].get("vocab_size")
    return int(v) if v is not None else None
