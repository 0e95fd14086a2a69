"""The tokenizer comparison of the preflight, on each file layout it reads: tokenizer.json, vocab.json, vocab.txt,
SentencePiece's tokenizer.model, and a .nemo archive naming its tokenizer in model_config.yaml."""

from __future__ import annotations

import io
import json
import struct
import tarfile
from pathlib import Path
from typing import Any

import pytest

from nemotron.core.paths import shipped_root
from nemotron.models import tokenizer_match
from nemotron.models.tokenizer_match import difference, read_tokenizer

SHIPPED = shipped_root() / "tiny"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def sentencepiece_model(pieces: list[str]) -> bytes:
    """A ModelProto as SentencePiece writes it: `pieces` (field 1: piece text, a float score, a type varint), then a
    trainer spec (field 2) the reader must skip."""
    body = b""
    for i, piece in enumerate(pieces):
        entry = _field(1, piece.encode()) + b"\x15" + struct.pack("<f", -float(i)) + b"\x18" + _varint(1)
        body += _field(1, entry)
    return body + _field(2, _field(1, b"unigram.model"))


def _nemo(path: Path, vocab: bytes, library: str = "sentencepiece") -> Path:
    config = {"tokenizer": {"library": library, "model": "nemo:0a1b_tokenizer.model"}}
    with tarfile.open(path, "w") as tar:
        for name, data in (
            ("./model_config.yaml", json.dumps(config).encode()),
            ("./0a1b_tokenizer.model", vocab),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_sentencepiece_pieces_are_read_in_id_order(tmp_path: Path) -> None:
    d = tmp_path / "sp"
    d.mkdir()
    (d / "tokenizer.model").write_bytes(sentencepiece_model(["<unk>", "<s>", "</s>", "▁a", "▁b"]))
    tok = read_tokenizer(d)
    assert tok is not None and tok.vocabulary() == ("<unk>", "<s>", "</s>", "▁a", "▁b")


def test_two_nemo_archives_differ_at_the_first_swapped_piece(tmp_path: Path) -> None:
    a = read_tokenizer(_nemo(tmp_path / "a.nemo", sentencepiece_model(["<unk>", "<s>", "</s>", "▁a", "▁b"])))
    b = read_tokenizer(_nemo(tmp_path / "b.nemo", sentencepiece_model(["<unk>", "<s>", "</s>", "▁b", "▁a"])))
    assert a is not None and b is not None
    assert a.where == f"{tmp_path / 'a.nemo'}:0a1b_tokenizer.model"
    assert difference(a, b) == "vocabularies of 5 tokens each; token id 3 is '▁a' vs '▁b'"
    same = read_tokenizer(
        _nemo(tmp_path / "c.nemo", sentencepiece_model(["<unk>", "<s>", "</s>", "▁a", "▁b"]))
    )
    assert same is not None and difference(a, same) is None


def test_what_cannot_be_read_here_is_not_compared(tmp_path: Path) -> None:
    (tmp_path / "not_a_tar.nemo").write_bytes(b"tar")
    (tmp_path / "no_tokenizer").mkdir()
    (tmp_path / "no_tokenizer" / "config.json").write_text("{}")
    assert read_tokenizer(tmp_path / "not_a_tar.nemo") is None
    plain = _nemo(tmp_path / "plain.nemo", sentencepiece_model(["<unk>", "▁a"]))
    with tarfile.open(tmp_path / "gz.nemo", "w:gz") as gz:
        gz.add(plain, arcname="inner")  # compressed: listing it would mean decompressing it whole
    assert read_tokenizer(plain) is not None and read_tokenizer(tmp_path / "gz.nemo") is None
    assert read_tokenizer(tmp_path / "no_tokenizer") is None
    assert read_tokenizer(tmp_path / "absent") is None


def test_vocab_json_and_vocab_txt(tmp_path: Path) -> None:
    gpt2, bert = tmp_path / "gpt2", tmp_path / "bert"
    gpt2.mkdir()
    bert.mkdir()
    (gpt2 / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "c": 2}))
    (gpt2 / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": "c"}}))
    (bert / "vocab.txt").write_text("a\nb\nc\n")
    (bert / "tokenizer_config.json").write_text(json.dumps({"eos_token": "b"}))
    one, two = read_tokenizer(gpt2), read_tokenizer(bert)
    assert one is not None and two is not None
    assert one.vocabulary() == two.vocabulary() == ("a", "b", "c")
    assert difference(one, two) == "special tokens eos_token 'c' vs 'b'"


def test_a_role_only_one_side_names_is_not_a_difference(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d, config in ((a, {"eos_token": "<eos>"}), (b, {"eos_token": "<eos>", "pad_token": "<eos>"})):
        d.mkdir()
        (d / "tokenizer.json").write_bytes((SHIPPED / "sft_policy" / "tokenizer.json").read_bytes())
        (d / "tokenizer_config.json").write_text(json.dumps(config))
    ta, tb = read_tokenizer(a), read_tokenizer(b)
    assert ta is not None and tb is not None and difference(ta, tb) is None


def test_added_tokens_of_tokenizer_config_count(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "tokenizer.json").write_bytes((SHIPPED / "sft_policy" / "tokenizer.json").read_bytes())
    added: dict[str, Any] = {"476": {"content": "<|im_end|>", "special": True}}
    (b / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}))
    ta, tb = read_tokenizer(a), read_tokenizer(b)
    assert ta is not None and tb is not None
    assert difference(ta, tb) == "vocabularies of 476 vs 477 tokens; ids from 476 exist in only one"


def test_equal_files_are_not_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A matching pair costs a hash of each file: the shipped policy and reward model share their tokenizer.json."""
    monkeypatch.setattr(tokenizer_match, "_PARSED", {})
    policy, reward_model = read_tokenizer(SHIPPED / "sft_policy"), read_tokenizer(SHIPPED / "reward_model")
    assert policy is not None and reward_model is not None
    assert difference(policy, reward_model) is None
    assert tokenizer_match._PARSED == {}


def test_nemo_aligner_ppo_is_refused_when_the_nemo_tokenizers_differ(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    """NeMo-Aligner's actor sends token ids to its reward and critic servers: the two .nemo archives must agree."""
    policy = _nemo(tmp_path / "sft.nemo", sentencepiece_model(["<unk>", "<s>", "</s>", "▁a", "▁b"]))
    reward_model = _nemo(tmp_path / "rm.nemo", sentencepiece_model(["<unk>", "<s>", "</s>", "▁b", "▁a"]))
    args = ["steps", "run", "rl/ppo", "-c", "default", "-b", "local_slurm", "backend=nemo_aligner"]
    r = run_cli(*args, f"inputs.policy={policy}", f"inputs.reward_model={reward_model}", "--dry-run")
    assert r.code == 2, r.err[-2000:]
    assert r.err.count("\n") == 1 and "Traceback" not in r.err
    assert f"{policy}:0a1b_tokenizer.model vs {reward_model}:0a1b_tokenizer.model" in r.err
    assert not home.exists()
    same = _nemo(tmp_path / "rm_same.nemo", sentencepiece_model(["<unk>", "<s>", "</s>", "▁a", "▁b"]))
    r = run_cli(*args, f"inputs.policy={policy}", f"inputs.reward_model={same}", "--dry-run")
    assert r.code == 0, r.err[-2000:]


def _cached(cache: Path, repo_id: str, tokenizer: dict[str, Any]) -> Path:
    """A model as a download leaves it in the Hugging Face cache: refs/main names the snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    (snapshot / "tokenizer.json").write_text(json.dumps(tokenizer))
    return snapshot


def test_a_hub_policy_is_compared_from_the_local_hugging_face_cache(
    home: Path, tmp_path: Path, run_cli: Any
) -> None:
    shipped = json.loads((SHIPPED / "sft_policy" / "tokenizer.json").read_text())
    swapped = json.loads(json.dumps(shipped))
    vocab = swapped["model"]["vocab"]
    three, four = (next(t for t, i in vocab.items() if i == n) for n in (3, 4))
    vocab[three], vocab[four] = 4, 3
    cache = tmp_path / "hf"
    snapshot = _cached(cache, "acme/swapped", swapped)
    _cached(cache, "acme/same", shipped)
    env = {"HF_HUB_CACHE": str(cache)}
    args = ["steps", "run", "rl/reinforce", "-c", "tiny", "--dry-run"]
    r = run_cli(*args, "inputs.policy=acme/swapped", env=env)
    assert r.code == 2, r.err[-2000:]
    assert f"{snapshot}/tokenizer.json vs {SHIPPED / 'reward_model' / 'tokenizer.json'}" in r.err
    assert f"token id 3 is {four!r} vs {three!r}" in r.err
    for cached_or_not in ("acme/same", "acme/not-downloaded"):
        r = run_cli(*args, f"inputs.policy={cached_or_not}", env=env)
        assert r.code == 0, r.err[-2000:]
    assert not home.exists()


@pytest.mark.parametrize(
    "broken",
    [
        '{"model": {"vocab": {"a": 0',
        '{"model": {"vocab": [1]}}',
        "[1, 2]",
        '{"model": {"vocab": {"a": "x"}}}',
    ],
)
def test_a_malformed_tokenizer_file_is_left_to_the_loadable_inputs_check(tmp_path: Path, broken: str) -> None:
    """No traceback from the comparison: whether the checkpoint loads is another preflight's to say."""
    from nemotron.artifacts.binding import Binding
    from nemotron.catalog import Catalog

    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "tokenizer.json").write_text(broken)
    consumes = Catalog().get("rl/reinforce").manifest.consumes
    rm = str(SHIPPED / "reward_model")
    bindings = [
        Binding("policy", "checkpoint_hf", str(policy), "path", str(policy)),
        Binding("reward_model", "reward_model_hf", rm, "path", rm),
    ]
    tokenizer_match.check_token_ids_meet(consumes, {"backend": "builtin"}, bindings)
