"""The `vllm serve` command line of the judge (a pure function; the server itself runs in tests/vllm)."""

from __future__ import annotations

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

    from nemotron.paths import shipped_root
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
