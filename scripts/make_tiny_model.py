#!/usr/bin/env python3
"""Make a tiny random-weight Qwen3 model that a real vLLM (CPU) can serve.

    <vllm-venv>/bin/python scripts/make_tiny_model.py OUTDIR [--force] [--kind embed]

Offline and deterministic (fixed seed, fixed corpus): the same library versions give the
same bytes. Needs torch, transformers, tokenizers and safetensors (the venv made by
scripts/setup_vllm.sh has them all).

The model (see FACTS.md, "Running a real vLLM on a machine without a GPU"):
  Qwen3ForCausalLM, hidden_size 128, 2 layers, 2 attention heads, 1 KV head, head_dim 64
  (vLLM's CPU attention rejects head_dim 16), max_position_embeddings 4096, tied embeddings,
  bfloat16 safetensors; a byte-level BPE tokenizer trained on a few sentences, eos
  <|im_end|>, ChatML chat template. It writes gibberish, through the real engine.

`--kind embed` makes an embedding model instead: the same weights laid out as a
sentence-transformers model (modules.json, 1_Pooling/config.json: last-token pooling, as
Qwen3-Embedding). vLLM then picks the pooling runner by itself: it serves /v1/embeddings
(and /pooling, /v1/score) and answers /v1/completions with 404.

Files in OUTDIR: config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, special_tokens_map.json, chat_template.jinja, sha256sums.txt
(`sha256sum -c sha256sums.txt` format: "<hex>  <name>", for every file above) and the stamp
.vllmwatch-tiny-model, written last. A run finds a complete model (stamp present, same
recipe, every file there) and does nothing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

RECIPE = "tiny-qwen3-v1"  # bump when anything below changes the output
RECIPES = {"generate": RECIPE, "embed": "tiny-qwen3-embed-v1"}
EMBED_FILES = ["modules.json", "1_Pooling/config.json"]
STAMP = ".vllmwatch-tiny-model"
SEED = 0
MAX_POSITIONS = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
BPE_VOCAB = 512
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! This is a tiny model for testing a vLLM watchdog.",
    "A supervisor restarts the server when the engine dies or hangs.",
    "Health checks, metrics and a one token completion probe.",
    "user assistant system: What is the capital of France? Paris.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 and punctuation .,;:!?()[]{}\"'",
    "def main():\n    print('hello')\n    return 0\n",
    "Once upon a time there was a small language model that knew nothing at all.",
]
MODEL_FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
]


def log(msg: str) -> None:
    print(f"[make_tiny_model] {msg}", flush=True)


def files_of(recipe: str) -> list[str]:
    return MODEL_FILES + (EMBED_FILES if recipe == RECIPES["embed"] else [])


def is_complete(out: Path, recipe: str = RECIPE) -> bool:
    stamp = out / STAMP
    try:
        if stamp.read_text().strip() != recipe:
            return False
    except OSError:
        return False
    return all((out / name).is_file() for name in [*files_of(recipe), "sha256sums.txt"])


def build_tokenizer(tmp: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    tok.save(str(tmp / "tokenizer.json"))

    (tmp / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2) + "\n")
    (tmp / "special_tokens_map.json").write_text(json.dumps({
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    }, indent=2) + "\n")
    (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return tok.get_vocab_size()


def build_embed_model(tmp: Path, tok_vocab: int) -> int:
    """The same Qwen3 model, laid out as a sentence-transformers embedding model.

    modules.json with a Pooling module (last token, as Qwen3-Embedding) and a Normalize one:
    vLLM reads them and picks the pooling runner by itself, with no --runner flag.
    """
    n_params = build_model(tmp, tok_vocab)
    (tmp / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ], indent=2) + "\n")
    (tmp / "1_Pooling").mkdir()
    (tmp / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": 128, "pooling_mode_lasttoken": True,
        "include_prompt": True}, indent=2) + "\n")
    return n_params


def build_model(tmp: Path, tok_vocab: int) -> int:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    vocab = (tok_vocab + 63) // 64 * 64  # >= tokenizer size, padded like real models
    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
        use_cache=True,
    )
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(str(tmp), safe_serialization=True)
    # generation_config.json: write our own (save_pretrained may or may not write one).
    (tmp / "generation_config.json").write_text(json.dumps({
        "bos_token_id": 0,
        "eos_token_id": [2, 0],
        "pad_token_id": 0,
    }, indent=2) + "\n")
    return sum(p.numel() for p in model.parameters())


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check(tmp: Path, kind: str = "generate") -> None:
    """Load the result back the way vLLM will (AutoConfig / AutoTokenizer)."""
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(str(tmp), local_files_only=True)
    assert cfg.model_type == "qwen3" and cfg.head_dim == 64, cfg
    if kind == "embed":
        modules = json.loads((tmp / "modules.json").read_text())
        assert modules[1]["type"].endswith(".Pooling"), modules
    tok = AutoTokenizer.from_pretrained(str(tmp), local_files_only=True)
    assert tok.eos_token == "<|im_end|>", tok.eos_token
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", repr(text)
    ids = tok("Hello, world!")["input_ids"]
    assert tok.decode(ids) == "Hello, world!", tok.decode(ids)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--force", action="store_true", help="rebuild even if complete")
    ap.add_argument("--kind", choices=sorted(RECIPES), default="generate",
                    help="generate (Qwen3ForCausalLM, default) or embed (Qwen2Model)")
    args = ap.parse_args()
    out: Path = args.outdir.resolve()
    recipe = RECIPES[args.kind]

    if not args.force and is_complete(out, recipe):
        log(f"{out} already has a complete model ({recipe}); nothing to do")
        return 0

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    t0 = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tok_vocab = build_tokenizer(tmp)
        build = build_embed_model if args.kind == "embed" else build_model
        n_params = build(tmp, tok_vocab)
        check(tmp, args.kind)
        # Keep exactly the files we describe (drop anything else save_pretrained added).
        files = files_of(recipe)
        tops = {n.split("/")[0] for n in files}
        for p in tmp.iterdir():
            if p.name not in tops:
                p.unlink() if p.is_file() else shutil.rmtree(p)
        missing = [n for n in files if not (tmp / n).is_file()]
        if missing:
            raise SystemExit(f"missing after build: {missing}")
        (tmp / "sha256sums.txt").write_text(
            "".join(f"{sha256(tmp / n)}  {n}\n" for n in sorted(files)))

        out.mkdir(parents=True, exist_ok=True)
        (out / STAMP).unlink(missing_ok=True)
        for n in [*files, "sha256sums.txt"]:
            (tmp / n).chmod(0o644)
            (out / n).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / n, out / n)
        (out / STAMP).write_text(recipe + "\n")  # last: marks the model complete
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"wrote {out}: {n_params} params, tokenizer vocab {tok_vocab}, "
        f"{(out / 'model.safetensors').stat().st_size} bytes of weights, "
        f"{time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
