"""The two files torchtitan's llama3 debug config reads, made offline: a tokenizer and a small c4_test.

torchtitan 0.3.0's ``llama3_debugmodel`` (torchtitan/models/llama3/config_registry.py) reads its tokenizer from
``./tests/assets/tokenizer`` (``hf_assets_path``: tokenizer.json and tokenizer_config.json, loaded by
torchtitan/components/tokenizer.py HuggingFaceTokenizer) and its data set ``c4_test`` from
``tests/assets/c4_test`` (torchtitan/hf_datasets/text_datasets.py: ``load_dataset(path, split="train")``, each
row's ``text``), both relative to the working directory: they are in torchtitan's repository, not in its wheel.
This script writes both under DIR, so ``python -m torchtitan.train`` run from DIR finds them with no download:
a byte-level BPE trained with the ``tokenizers`` library on the same generated text the data set holds, within
the debug model's 2048-entry vocabulary.

Usage (in torchtitan's environment, scripts/torchtitan-env.sh): python torchtitan_assets.py DIR
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

VOCAB = 2048  # the debug model's vocab_size (torchtitan/models/llama3/__init__.py _debugmodel)
SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>")
TEXT = ("the chip trains a model on shards of data while every rank keeps its own optimizer state and "
        "gradients reduce across the mesh so that each step moves weights by the same amount on all ranks "
        "tokens flow through attention and feed forward layers before the loss is measured")
WORDS = TEXT.split(" ")


def documents(count: int = 400, seed: int = 0) -> list[str]:
    """Sentences over a small vocabulary with a repeating grammar: text a tiny model learns within ten steps."""
    rng = random.Random(seed)
    return [" ".join(" ".join(WORDS[start:start + rng.randint(4, 12)])
                     for start in (rng.randrange(len(WORDS) - 4) for _ in range(rng.randint(8, 20))))
            for _ in range(count)]


def write(root: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = documents()
    data = root / "tests" / "assets" / "c4_test"
    data.mkdir(parents=True, exist_ok=True)
    with (data / "data.json").open("w") as out:
        for text in texts:
            out.write(json.dumps({"text": text}) + "\n")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIAL),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    assets = root / "tests" / "assets" / "tokenizer"
    assets.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(assets / "tokenizer.json"))
    # What HuggingFaceTokenizer reads the BOS/EOS tokens from (its _infer_special_tokens).
    (assets / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": SPECIAL[0], "eos_token": SPECIAL[1], "add_bos_token": True, "add_eos_token": True}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: torchtitan_assets.py DIR")
    write(Path(sys.argv[1]))
