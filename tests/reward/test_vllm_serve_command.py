"""The `vllm serve` command line of the judge (a pure function; the server itself runs in tests/vllm)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from nemotron.reward.vllm_serve import PLAIN_CHAT_TEMPLATE, vllm_serve_command


def test_the_token_is_never_on_the_command_line_and_the_template_only_when_needed() -> None:
    cmd = vllm_serve_command("py", "/m", 8123, max_length=64, memory=0.3, chat_template=None, name="judge")
    assert cmd[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--port") + 1] == "8123"
    assert cmd[cmd.index("--served-model-name") + 1] == "judge"
    assert (
        cmd[cmd.index("--max-model-len") + 1] == "64"
        and cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.3"
    )
    assert "--chat-template" not in cmd and not any("key" in part.lower() for part in cmd)
    templated = vllm_serve_command("py", "/m", 1, max_length=8, memory=0.5, chat_template="/t.jinja", name="j",
                                   structured="outlines")  # fmt: skip
    assert templated[-2:] == ["--chat-template", "/t.jinja"]
    assert templated[templated.index("--structured-outputs-config") + 1] == '{"backend": "outlines"}'


def test_metaspace_tokenizers_get_the_outlines_backend() -> None:
    import json

    from nemotron.core.paths import shipped_root
    from nemotron.reward.vllm_serve import structured_outputs_backend

    tiny = json.loads((shipped_root() / "tiny" / "sft_policy" / "tokenizer.json").read_text())
    assert structured_outputs_backend(tiny) == "outlines"  # our tiny BPE decodes with Metaspace
    assert structured_outputs_backend({"decoder": {"type": "ByteLevel"}}) == "auto"  # Llama 3, Qwen2, GPT-2
    assert (
        structured_outputs_backend({"decoder": {"type": "Sequence", "decoders": [{"type": "Metaspace"}]}})
        == "outlines"
    )


def test_the_plain_template_renders_like_our_chat_server() -> None:
    from jinja2 import Template

    from nemotron.reward.chat_server import render_messages

    messages = [("system", "be fair"), ("user", "rate it")]
    rendered = Template(PLAIN_CHAT_TEMPLATE).render(
        messages=[{"role": r, "content": c} for r, c in messages], add_generation_prompt=True
    )
    assert rendered == render_messages(messages)


def test_a_hub_id_lets_vllm_take_its_own_length() -> None:
    cmd = vllm_serve_command("py", "org/model", 1, max_length=None, memory=0.9, chat_template=None, name="judge",
                             host="0.0.0.0")  # fmt: skip
    assert "--max-model-len" not in cmd and cmd[cmd.index("--host") + 1] == "0.0.0.0"


def test_the_group_command_refuses_a_wide_bind_without_a_token_before_starting_anything(
    tmp_path: Path,
) -> None:
    """`python -m nemotron.reward.vllm_serve --host 0.0.0.0` (Slurm group 0) needs $NEMOTRON_REWARD_TOKEN: exit 2, one
    line, no vllm started (this venv has none: a start would fail differently)."""
    env = {k: v for k, v in os.environ.items() if k != "NEMOTRON_REWARD_TOKEN"}
    ready = tmp_path / "ready.json"
    done = subprocess.run([sys.executable, "-m", "nemotron.reward.vllm_serve", "--model", str(tmp_path), "--host",
                           "0.0.0.0", "--ready-file", str(ready)], capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: refusing to serve on 0.0.0.0 without a bearer token: set $NEMOTRON_REWARD_TOKEN or give a token file "
        "(mode 0600), or bind 127.0.0.1"
    ]
    assert not ready.exists()


def test_the_group_command_refuses_a_token_file_others_can_read(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("a-token-of-twenty-chars\n")
    token_file.chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "nemotron.reward.vllm_serve", "--model", str(tmp_path), "--host",
                           "0.0.0.0", "--token-file", str(token_file)], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "has mode 0644; others could read the token" in done.stderr
