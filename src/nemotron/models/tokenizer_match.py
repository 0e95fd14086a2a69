"""Preflight: two models that pass token ids between them must read each id as the same token.

A policy sends its own token ids to the reward model (our reward server, an in-process reward model, NeMo-Aligner's
remote RM and critic). If their tokenizers differ, the reward model scores text the policy never wrote and nothing
fails. `check_token_ids_meet` compares the tokenizers from their files at compile time (no torch, no transformers)
and refuses a pair that differs, naming both files and the first difference.

What counts: the vocabulary (the token text of every id, added tokens included) and the special tokens
(bos/eos/unk/pad/... by role). Merges and normalisers do not: they change how text becomes ids, not what an id
means. Equal vocabulary files are recognised by their bytes' hash without parsing them, so a matching pair costs
one read of each file.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import yaml

from nemotron.errors import UserError

if TYPE_CHECKING:
    from nemotron.catalog import Consumes

SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
# Where an HF checkpoint keeps its vocabulary, in the order transformers prefers them.
VOCAB_FILES = ("tokenizer.json", "vocab.json", "tokenizer.model", "vocab.txt")
# The files that name special and added tokens, in _specials_and_added's argument order
SPECIAL_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


class _Bound(Protocol):
    """What the check reads of a compile binding (nemotron.artifacts.binding.Binding)."""

    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def ref(self) -> str: ...
    @property
    def path(self) -> str | None: ...


class TokenizerFiles(NamedTuple):
    """One model's tokenizer as its files state it."""

    where: str  # the vocabulary file, as messages name it (a .nemo member as ARCHIVE:MEMBER)
    kind: str  # which of VOCAB_FILES (or a .nemo's tokenizer library file) holds the vocabulary
    data: bytes  # that file's bytes
    specials: Mapping[str, str]  # role -> token text
    added: Mapping[int, str]  # id -> text of tokens added beside the vocabulary file (tokenizer_config.json)

    @property
    def digest(self) -> str:
        """Hash of the raw vocabulary file: equal digests mean equal vocabularies without parsing."""
        return _sha256(self.data)

    def vocabulary(self) -> tuple[str | None, ...]:
        """Token text by id (None where no token has that id)."""
        by_id = dict(_parsed(self.kind, self.digest, self.data))
        for i, text in self.added.items():  # an id the vocabulary file holds keeps its token there
            by_id.setdefault(i, text)
        if not by_id:
            return ()
        out: list[str | None] = [None] * (max(by_id) + 1)
        for i, text in by_id.items():
            out[i] = text
        return tuple(out)


_PARSED: dict[tuple[str, str], tuple[tuple[int, str], ...]] = {}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _parsed(kind: str, digest: str, data: bytes) -> tuple[tuple[int, str], ...]:
    """(id, text) pairs of a vocabulary file, parsed once per content (a step binds the same file several times)."""
    key = (kind, digest)
    if key not in _PARSED:
        _PARSED[key] = tuple(_PARSERS[kind](data))
    return _PARSED[key]


# ----------------------------------------------------------------------------- vocabulary files


def _tokenizer_json(data: bytes) -> list[tuple[int, str]]:
    """tokenizers' tokenizer.json: model.vocab ({text: id}, or Unigram's [[text, score], ...]) and added_tokens."""
    tree = json.loads(data)
    vocab = tree.get("model", {}).get("vocab") or {}
    pairs = (
        [(int(i), str(t)) for t, i in vocab.items()]
        if isinstance(vocab, dict)
        else [(i, str(entry[0])) for i, entry in enumerate(vocab)]
    )
    pairs += [(int(a["id"]), str(a["content"])) for a in tree.get("added_tokens") or []]
    return pairs


def _vocab_json(data: bytes) -> list[tuple[int, str]]:
    """GPT-2's vocab.json: {text: id}."""
    return [(int(i), str(t)) for t, i in json.loads(data).items()]


def _vocab_txt(data: bytes) -> list[tuple[int, str]]:
    """BERT's vocab.txt: one token a line, its id the line number."""
    return list(enumerate(data.decode("utf-8").splitlines()))


def _sentencepiece(data: bytes) -> list[tuple[int, str]]:
    """A SentencePiece model (ModelProto): the text of each `pieces` entry (field 1, whose field 1 is the piece), in
    id order. Only these two fields are read; sentencepiece itself is not a dependency of the compile path."""
    pieces = []
    for field_number, value in _protobuf_fields(data):
        if field_number == 1 and isinstance(value, bytes):
            piece = next((v for f, v in _protobuf_fields(value) if f == 1 and isinstance(v, bytes)), b"")
            pieces.append(piece.decode("utf-8", "replace"))
    return list(enumerate(pieces))


def _protobuf_fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message's top-level fields: varints as int, length-delimited as
    bytes; fixed 32/64-bit values are skipped over."""
    fields: list[tuple[int, int | bytes]] = []
    pos = 0

    def varint() -> int:
        nonlocal pos
        shift = result = 0
        while True:
            if pos >= len(data):
                raise ValueError("truncated varint")
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7

    while pos < len(data):
        tag = varint()
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            fields.append((number, varint()))
        elif wire == 2:
            size = varint()
            fields.append((number, data[pos : pos + size]))
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return fields


_PARSERS: dict[str, Callable[[bytes], list[tuple[int, str]]]] = {
    "tokenizer.json": _tokenizer_json,
    "vocab.json": _vocab_json,
    "tokenizer.model": _sentencepiece,
    "vocab.txt": _vocab_txt,
}


# ----------------------------------------------------------------------------- reading a checkpoint's tokenizer


def _special_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _json_object(data: bytes | None) -> dict[str, Any]:
    try:
        tree = json.loads(data) if data is not None else {}
    except ValueError:
        return {}
    return tree if isinstance(tree, dict) else {}


def _specials_and_added(
    tokenizer_config: bytes | None, special_tokens_map: bytes | None, added_tokens: bytes | None
) -> tuple[dict[str, str], dict[int, str]]:
    """Special tokens by role and added tokens by id, by transformers' own rule (5.24,
    PreTrainedTokenizerBase._from_pretrained): tokenizer_config.json's roles, then, where that file has no
    `added_tokens_decoder` (a tokenizer saved the old way), special_tokens_map.json's roles over them and
    added_tokens.json's tokens; where it has one, special_tokens_map.json and added_tokens.json are not read at all."""
    config = _json_object(tokenizer_config)
    legacy = "added_tokens_decoder" not in config
    specials: dict[str, str] = {}
    for tree in (config, _json_object(special_tokens_map) if legacy else {}):
        for role in SPECIAL_ROLES:
            text = _special_text(tree.get(role))
            if text is not None:
                specials[role] = text
    added: dict[int, str] = {}
    if legacy:
        added = {int(i): str(t) for t, i in _json_object(added_tokens).items() if isinstance(i, int)}
    else:
        for i, entry in (config.get("added_tokens_decoder") or {}).items():
            text = _special_text(entry)
            if text is not None and str(i).isdigit():
                added[int(i)] = text
    return specials, added


# What a malformed tokenizer file raises while it is read or parsed. Such a pair is not compared: whether the
# checkpoint loads at all is the loadable-inputs preflight's to say.
_MALFORMED = (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError, yaml.YAMLError)


def read_tokenizer(path: Path) -> TokenizerFiles | None:
    """The tokenizer of an HF checkpoint directory or a .nemo archive; None when none can be read here (no
    tokenizer files, a hub id, an unreadable archive): the check then has nothing to compare."""
    try:
        if path.is_dir():
            return _from_directory(path)
        if not path.is_file():
            return None
        import tarfile  # here, not at the top: most inputs are directories, and the dry-run's start-up counts

        try:
            return _from_nemo(path) if tarfile.is_tarfile(path) else None
        except tarfile.TarError:
            return None
    except _MALFORMED:
        return None


def _from_directory(path: Path) -> TokenizerFiles | None:
    vocab_file = next((path / name for name in VOCAB_FILES if (path / name).is_file()), None)
    if vocab_file is None:
        return None
    specials, added = _specials_and_added(*(_read(path / name) for name in SPECIAL_FILES))
    return TokenizerFiles(str(vocab_file), vocab_file.name, vocab_file.read_bytes(), specials, added)


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _from_nemo(path: Path) -> TokenizerFiles | None:
    """A .nemo (NeMo's tar of model_config.yaml and weights): its `tokenizer:` section names the vocabulary as
    `nemo:FILE` members (a SentencePiece `model`, or a `vocab_file`); a tokenizer named only by a hub id is not
    read."""
    # "r:": a plain tar, as NeMo writes; a compressed archive would be decompressed whole to list it, so it is
    # left unread (ReadError) rather than slow every dry-run down.
    import tarfile

    with tarfile.open(path, "r:") as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}

        def member(name: str) -> bytes | None:
            found = members.get(name) or next((m for n, m in members.items() if n.endswith("/" + name)), None)
            extracted = tar.extractfile(found) if found else None
            return extracted.read() if extracted else None

        config = member("model_config.yaml")
        tree = yaml.safe_load(config) if config else None
        section = tree.get("tokenizer") if isinstance(tree, dict) else None
        if not isinstance(section, dict):
            return None
        for key, kind in (("model", "tokenizer.model"), ("vocab_file", None)):
            ref = section.get(key)
            if not isinstance(ref, str) or not ref:
                continue
            name = ref.removeprefix("nemo:")
            data = member(name)
            if data is None:
                continue
            if kind is None:  # a vocab_file: GPT-2's vocab.json, a whole tokenizer.json, or BERT's vocab.txt
                kind = "tokenizer.json" if name.endswith("tokenizer.json") else "vocab.json"
                kind = kind if name.endswith(".json") else "vocab.txt"
            return TokenizerFiles(f"{path}:{name}", kind, data, {}, {})
    return None


def generation_config_problem(path: Path) -> str | None:
    """Where a checkpoint's generation_config.json names another EOS or pad token than its tokenizer: vLLM and
    transformers' generate stop at generation_config's eos_token_id (an id or a list of them), the trainer and
    the reward model read the tokenizer's, so a response would end at a token training never saw as its end. None
    when they agree or either is absent."""
    generation = _json_object(_read(path / "generation_config.json"))
    tokenizer = read_tokenizer(path) if generation else None
    if tokenizer is None:
        return None
    vocabulary = tokenizer.vocabulary()
    ids: dict[str, int] = {}
    for i, text in enumerate(vocabulary):
        if text is not None:
            ids.setdefault(text, i)
    problems = []
    for role, key in (("eos_token", "eos_token_id"), ("pad_token", "pad_token_id")):
        given, text = generation.get(key), tokenizer.specials.get(role)
        listed = given if isinstance(given, list) else [given]
        if given is None or text not in ids or ids[text] in listed:
            continue
        named = ", ".join(
            f"{i} ({vocabulary[i]!r})" if isinstance(i, int) and 0 <= i < len(vocabulary) else str(i)
            for i in listed
        )
        problems.append(
            f"generation_config.json's {key} is {named}, the tokenizer's {role} is {text!r} (id {ids[text]})"
        )
    return "; ".join(problems) or None


def hub_snapshot(repo_id: str) -> Path | None:
    """The snapshot of a hub model that a download left in this machine's Hugging Face cache (what its `main` named
    then), or None. Read from the cache's layout, so the compile path imports no huggingface_hub."""
    home = os.environ.get("HF_HOME") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    )
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(home) / "hub").expanduser()
    repo = cache / ("models--" + repo_id.removeprefix("hf://").replace("/", "--"))
    try:
        commit = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = repo / "snapshots" / commit
    return snapshot if commit and snapshot.is_dir() else None


def _local(binding: _Bound) -> Path | None:
    if binding.path:
        return Path(binding.path)
    return hub_snapshot(binding.ref) if binding.kind == "hub" else None


# ----------------------------------------------------------------------------- comparing two


def difference(a: TokenizerFiles, b: TokenizerFiles) -> str | None:
    """What differs between two tokenizers, in a few words; None when every id means the same token."""
    if a.digest != b.digest or a.kind != b.kind or a.added != b.added:
        va, vb = a.vocabulary(), b.vocabulary()
        if va != vb:
            if len(va) != len(vb):
                sizes = f"{len(va)} vs {len(vb)} tokens"
            else:
                sizes = f"{len(va)} tokens each"
            first = next((i for i, (x, y) in enumerate(zip(va, vb, strict=False)) if x != y), None)
            if first is None:
                return f"vocabularies of {sizes}; ids from {min(len(va), len(vb))} exist in only one"
            return f"vocabularies of {sizes}; token id {first} is {va[first]!r} vs {vb[first]!r}"
    roles = [
        r for r in SPECIAL_ROLES if r in a.specials and r in b.specials and a.specials[r] != b.specials[r]
    ]
    if roles:
        return "special tokens " + ", ".join(f"{r} {a.specials[r]!r} vs {b.specials[r]!r}" for r in roles)
    return None


def _applies(consumed: Consumes, config: Mapping[str, Any]) -> bool:
    """Whether this input reads another's token ids under `config`: not where the manifest says it gets text
    (e.g. backend=nemo_rl, whose reward environment re-tokenises the decoded text with the reward model's own
    tokenizer)."""
    if not consumed.reads_token_ids_of:
        return False
    for key, value in consumed.text_when.items():
        node: Any = config
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node == value:
            return False
    return True


def check_token_ids_meet(
    consumes: Sequence[Consumes], config: Mapping[str, Any], bindings: Sequence[_Bound]
) -> None:
    """Refuse (exit 2, one line per pair) a job in which an input reads the token ids of another input whose
    tokenizer differs from its own. A hub id is read from the local Hugging Face cache when a download left it
    there; inputs that are not here (other hub ids, paths on a cluster, unreadable archives) are not compared."""
    paths = {b.name: p for b in bindings if (p := _local(b)) is not None}
    problems = []
    for consumed in consumes:
        sender = consumed.reads_token_ids_of
        if not _applies(consumed, config) or consumed.name not in paths or sender not in paths:
            continue
        if paths[consumed.name].resolve() == paths[sender].resolve():
            continue
        theirs, ours = read_tokenizer(paths[sender]), read_tokenizer(paths[consumed.name])
        if theirs is None or ours is None:
            continue
        try:
            what = difference(theirs, ours)
        except _MALFORMED:
            continue
        if what is not None:
            problems.append(
                f"input '{consumed.name}' is given the token ids of input '{sender}', but their tokenizers "
                f"differ ({theirs.where} vs {ours.where}: {what}); use a {consumed.name} trained with the "
                f"{sender}'s tokenizer"
            )
    if len(problems) == 1:
        raise UserError(problems[0])
    if problems:
        raise UserError("tokenizers that must agree differ:", problems)
