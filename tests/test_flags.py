"""llama-server's command line on `ngramspec serve` (ngramspec/settings/flags.py).

Mostly model-free: flags are parsed with click (`make_context`, nothing runs), and
the app runs in-process on a fake engine (`create_app(engine_factory=...)`). Two
tests start the real model: the llama.cpp test harness' full command line (and a
shutdown with requests in flight), and the embeddings endpoints.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner
from server_stop import sigterm_seconds

from ngramspec.settings import flags
from ngramspec.settings import click_options
from ngramspec.cli.main import main
from ngramspec.settings.config import SpecConfig
from ngramspec.errors import ConfigError
from ngramspec.server.command import bind, serve
from ngramspec.settings.server import ServerSettings
from ngramspec.settings.typed import typed

DATA = Path(__file__).resolve().parent / "data" / "llama_server_flags.txt"
#: a valid value for flags whose value is not a plain number
VALUES = {"-fa": "off", "--flash-attn": "off", "--pooling": "mean", "-lm": "mmap",
          "--load-mode": "mmap", "--spec-type": "ngram-mod", "--chat-template": "chatml",
          "--chat-template-kwargs": "{}", "--spec-synth-rates": "0.5,0.25", "-ngl": "all",
          "--host": "127.0.0.1,::1", "-j": "{}", "--json-schema": "{}",
          "--slot-save-path": str(Path(__file__).resolve().parent), "-ctk": "q8_0",
          "--cache-type-k": "q8_0", "-ctv": "q4_0", "--cache-type-v": "q4_0",
          "--samplers": "top_k;temperature", "--sampler-seq": "kt", "--sampling-seq": "kt",
          "-l": "15043+1", "--logit-bias": "15043-inf"}


def llama_server_flags() -> list[tuple[str, int]]:
    rows = [ln.split() for ln in DATA.read_text().splitlines() if ln and not ln.startswith("#")]
    return [(name, int(n)) for name, n in rows]


def parse(*args: str) -> dict:
    """serve's parsed values for a command line (nothing runs)."""
    ctx = serve.make_context("serve", list(args), obj={})
    return dict(ctx.params)


@pytest.mark.parametrize("name,arity", llama_server_flags())
def test_every_llama_server_flag_parses(name, arity):
    args = [name] + [VALUES.get(name, "1")] * arity
    parse(*args)  # raises click.UsageError / BadParameter if not accepted


def test_table_has_no_spelling_twice_and_covers_the_list():
    seen: dict[str, str] = {}
    for f in flags.FLAGS:
        for n in f.names + f.neg:
            assert n not in seen, f"{n} in {f.dest} and {seen[n]}"
            seen[n] = f.dest
    missing = [n for n, _ in llama_server_flags() if n not in seen]
    assert not missing


def test_fa_off_is_flash_attn_not_f_a():
    assert parse("-fa", "off")["flash_attn"] == "off"
    ctx = main.commands["generate"].make_context("generate", ["-fa", "off", "-f", "p.txt"])
    assert ctx.params["flash_attn"] == "off" and ctx.params["prompt_file"] == "p.txt"
    assert parse("-np", "3", "-n", "5")["parallel"] == 3


def test_llama_cpp_spellings():
    v = parse("--backend_sampling", "--ctx_size", "100", "-kvu", "--no-jinja", "--no-slots",
              "--spec-type", "ngram-mod", "--spec-type", "ngram-simple")
    assert v["ctx_size"] == 100 and v["kv_unified"] is True and v["jinja"] is False
    assert v["slots"] is False and v["spec_type"] == "ngram-mod,ngram-simple"
    assert parse("-no-kvu")["kv_unified"] is False and parse()["kv_unified"] is None


def test_values_reach_settings():
    v = parse("--alias", "tinyllama-2, other", "--tags", "a,b", "--host", "127.0.0.1,::1",
              "--api-key", "k1,k2", "-c", "512", "-np", "2", "-n", "64", "--temp", "0",
              "-s", "42", "--no-cache-prompt", "-ngl", "99", "--slots", "--metrics")
    click_options.pop_unused(v)
    s = typed(v, serve=True).server
    # llama-server keeps aliases and tags in a std::set: sorted, the first is the id
    assert s.alias == ("other", "tinyllama-2") and s.model_id("file.gguf") == "other"
    assert s.tags == ("a", "b") and s.host == ("127.0.0.1", "::1")
    assert s.api_keys == ("k1", "k2") and s.n_ctx_slot == 256 and s.n_predict == 64
    assert s.sampling.temperature == 0 and s.sampling.seed == 42
    assert s.cache_prompt is False and s.n_gpu_layers == 99 and s.slots and s.metrics


def test_settings_fields_come_from_the_table():
    s = ServerSettings()
    for f in flags.for_command("serve", ("model", "request", "server")):
        want = f.default_for("serve")
        got = getattr(s, f.settings_field)
        assert got == (f.parse(want) if f.parse and (want is not None or f.parse in (flags.csv, flags.csv_set))
                       else want), f.dest
    assert s.n_predict == -1 and s.n_ctx == 4096 and s.host == ("127.0.0.1",)
    assert ServerSettings(host="127.0.0.1,::1").host == ("127.0.0.1", "::1")


def test_sampling_flags_come_from_sampling_params():
    """Each sampling flag that sets a SamplingParams field is typed and defaulted as the
    field is (but --temp 0.8 and --seed -1: llama.cpp's command line), and a command's
    defaults give SamplingParams' own values."""
    from dataclasses import fields

    from ngramspec.settings.sampling import RANDOM_SEED, SamplingParams
    from ngramspec.settings.sampling_flags import sampling_from_flags

    own = {f.name: f.default for f in fields(SamplingParams)}
    table = {f.dest: f for f in flags.FLAGS}
    mapped = flags.sampling_fields()
    assert len(mapped) >= 20 and set(mapped.values()) <= set(own)
    for dest, field in mapped.items():
        f = table[dest]
        assert f.type is type(own[field]), dest
        assert f.default == own[field] or (dest, f.default) in (("temp", 0.8), ("seed", -1)), dest
    values = flags.defaults("generate", ("sampling",))
    got = sampling_from_flags(values)
    want = SamplingParams(temperature=0.8, seed=RANDOM_SEED)
    assert got == want


def test_unused_flag_warns_once_and_serve_goes_on():
    r = CliRunner().invoke(main, ["serve", "-sm", "row", "--tensor-split", "1,1", "-sm", "layer",
                                  "--mmproj", "x.gguf", "--port", "70000"], obj={})
    lines = [ln for ln in r.output.splitlines() if "warning:" in ln]
    assert len(lines) == 3, r.output  # -sm (given twice), --tensor-split, --mmproj
    assert sum("--split-mode" in ln for ln in lines) == 1
    assert r.exit_code == 2 and "--port must be between 0 and 65535" in r.output  # parsed on


def test_noop_flags_are_silent():
    ctx = serve.make_context("serve", ["--offline", "--cont-batching", "--no-webui",
                                       "--threads-http", "4", "--swa-full", "-bs"], obj={})
    assert click_options.warnings_for(ctx, "serve", dict(ctx.params)) == []


def test_draft_spec_types_need_md():
    v = parse("--spec-type", "draft-simple")
    click_options.pop_unused(v)
    with pytest.raises(ConfigError, match="-md/--model-draft"):
        typed(v, serve=True).server
    v = parse("--spec-type", "draft-simple", "-md", "d.gguf")
    click_options.pop_unused(v)
    s = typed(v, serve=True).server
    assert s.spec.types == () and s.model_draft == "d.gguf"  # only the draft model drafts
    r = CliRunner().invoke(main, ["generate", "-p", "x", "--spec-type", "draft-mtp"], obj={})
    assert r.exit_code == 2 and "-md/--model-draft" in r.output and "Traceback" not in r.output


def test_bad_values_are_usage_errors():
    for args in (["-fa", "maybe"], ["-ngl", "many"],
                 ["--pooling", "max"]):
        r = CliRunner().invoke(main, ["serve", *args], obj={})
        assert r.exit_code == 2 and "Traceback" not in r.output, (args, r.output)


def test_commands_do_not_import_each_other():
    code = ("import sys; import ngramspec.server.command, ngramspec.batch.command; "
            "print('ngramspec.cli.main' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    assert out.stdout.strip() == "False", out.stderr


def test_context_params_keep_exactness():
    from ngramspec.engine.runtime import context_params
    from ngramspec.settings.engine import LoadOptions

    opts = LoadOptions(n_batch=32, n_ubatch=16, flash_attn="off", kv_unified=True)
    cp, notes = context_params(512, 2, 2, opts, batch_invariant=True)
    assert cp.flash_attn is True and cp.kv_unified is None
    assert cp.n_batch == 64 and cp.n_ubatch == 64 and len(notes) == 3
    cp, notes = context_params(512, 2, 2, opts, batch_invariant=False)
    assert (cp.flash_attn, cp.kv_unified, cp.n_batch, cp.n_ubatch) == (False, True, 32, 16)
    assert notes == []
    cp, notes = context_params(512, 1, 2, LoadOptions(n_batch=256, n_ubatch=1024), True)
    assert (cp.n_batch, cp.n_ubatch, notes) == (256, 256, [])  # ub <= b, as llama.cpp


def test_host_list_binds_every_address():
    try:
        with socket.socket(socket.AF_INET6) as s6:
            s6.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    socks = bind(("127.0.0.1", "::1"), port)
    try:
        assert [s.family for s in socks] == [socket.AF_INET, socket.AF_INET6]
        assert all(s.getsockname()[1] == port for s in socks)
    finally:
        for s in socks:
            s.close()


def test_accepted_connections_have_nagle_off():
    """A connection accepted by the event loop on `bind`'s socket (as uvicorn accepts
    them) has TCP_NODELAY: with Nagle on, a keep-alive response written as headers +
    body waited ~40 ms for the client's delayed ACK on every request after the first."""
    import asyncio

    (sock,) = bind(("127.0.0.1",), 0)

    async def accepted_nodelay() -> int:
        got: asyncio.Future = asyncio.get_running_loop().create_future()

        def on_connect(reader, writer):
            s = writer.get_extra_info("socket")
            got.set_result(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        async with server:
            _, w = await asyncio.open_connection(*sock.getsockname()[:2])
            flag = await asyncio.wait_for(got, 10)
            w.close()
            return flag

    try:
        assert asyncio.run(accepted_nodelay()) != 0
    finally:
        sock.close()


# ------------------------------------------------------------------ the app on a fake engine


def fake_engine(n_ctx: int = 512):
    model = SimpleNamespace(path=Path("/models/fake.gguf"), n_vocab=100, n_ctx_train=2048,
                            chat_template=None, bos_text="", eos_text="")
    ctx = SimpleNamespace(n_ctx=n_ctx, params=SimpleNamespace(n_threads=1))
    from ngramspec.engine.engine import Engine

    fake = SimpleNamespace(model=model, ctx=ctx, spec=SpecConfig(), draft_drafter=None,
                           pool=SimpleNamespace(nbytes=1 << 20), reusable_prefix=lambda *a: 0)
    fake.speculates = lambda *a, **kw: Engine.speculates(fake, *a, **kw)  # the engine's rule
    return fake


def client(**settings):
    from fastapi.testclient import TestClient

    from ngramspec.server.app import create_app

    app = create_app(ServerSettings(**settings), engine_factory=fake_engine, load_async=False)
    return TestClient(app)


def test_alias_tags_slots_off_and_api_keys():
    with client(alias="tinyllama-2", tags="t1,t2", slots=False, api_key="k1,k2") as c:
        h = {"Authorization": "Bearer k2"}
        m = c.get("/v1/models", headers=h).json()["data"][0]
        assert m["id"] == "tinyllama-2" and m["aliases"] == ["tinyllama-2"] and m["tags"] == ["t1", "t2"]
        assert c.get("/props", headers=h).json()["model_alias"] == "tinyllama-2"
        r = c.get("/slots", headers=h)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        assert c.get("/slots", headers={"Authorization": "Bearer k3"}).status_code == 401
        r = c.post("/v1/embeddings", json={"input": "x"}, headers=h)
        assert r.status_code == 501 and "--embeddings" in r.json()["error"]["message"]
    with client() as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "fake.gguf"
        assert c.get("/slots").status_code == 200


def test_chat_template_by_name_file_and_no_jinja(tmp_path):
    from ngramspec.jobs.chat import chat_prompt, check_template

    msgs = [SimpleNamespace(role="user", content="Hi")]
    model = fake_engine().model
    s = ServerSettings(chat_template="chatml")
    assert chat_prompt(model, msgs, s) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ extra }}")
    s = ServerSettings(chat_template="chatml", chat_template_file=str(f),
                       chat_template_kwargs='{"extra": "!"}')
    assert chat_prompt(model, msgs, s) == "<user>Hi!"  # the file wins, kwargs reach Jinja
    with pytest.raises(ConfigError, match="built-in names"):
        check_template(ServerSettings(chat_template_file=str(f), jinja=False))
    assert chat_prompt(model, msgs, ServerSettings()).startswith("<start_of_turn>user\nHi")


def test_cache_prompt_default_comes_from_the_flag():
    from ngramspec.server.prepare import prepare
    from ngramspec.server.state import ServerState
    from ngramspec.jobs.types import NativeCompletionRequest

    import numpy as np

    for flag, body, want in ((True, {}, True), (False, {}, False), (False, {"cache_prompt": True}, True)):
        state = ServerState(ServerSettings(cache_prompt=flag))
        state.engine, state.n_ctx_slot = fake_engine(), 512
        req = NativeCompletionRequest.model_validate({"prompt": "x", **body})
        request = SimpleNamespace(headers={})
        prep = prepare(state, req, request, np.array([1, 2], dtype=np.int32), "x", 4)
        assert prep.job.cache_prompt is want


# ------------------------------------------------------------------ the real model

#: every flag llama.cpp's test harness (tools/server/tests/utils.py, ServerProcess.start)
#: can emit, in the form it emits it; port/host/model come from start_server
HARNESS = ["--temp", "0.8", "--seed", "42", "--host", "127.0.0.1", "--offline",
           "--model-url", "https://example.invalid/m.gguf", "--hf-repo", "ggml-org/models",
           "--hf-file", "tinyllamas/stories260K.gguf", "--models-dir", "models", "--models-max", "2",
           "--models-preset", "p.ini", "--cors-origins", "*", "--batch-size", "32",
           "--ubatch-size", "32", "--threads", "2", "--n-gpu-layers", "99", "--cont-batching",
           "--embedding", "--reranking", "--metrics", "--kv-unified", "--swa-full", "--slots",
           "--no-slots", "--pooling", "mean", "--alias", "tinyllama-2", "--tags", "t1,t2",
           "--ctx-size", "512", "--parallel", "2", "-ctk", "f16", "-ctv", "f16", "-fa", "off",
           "--n-predict", "64", "--slot-save-path", tempfile.gettempdir(), "--grp-attn-n", "2",
           "--grp-attn-w", "512", "--verbose", "--lora", "l.gguf", "--context-shift",
           "--spec-type", "ngram-mod", "--api-key", "sk-test", "--spec-draft-n-max", "8",
           "--spec-draft-n-min", "4", "--spec-synth-rates", "1,1,1,1,1,1,1,1", "--no-ui",
           "--no-models-autoload", "--jinja", "--no-jinja", "--reasoning-format", "none",
           "--reasoning", "off", "--chat-template", "chatml", "--mmproj-url", "https://x.invalid",
           "--no-mmproj", "--media-path", "media", "--sleep-idle-seconds", "60", "--cache-ram", "0",
           "--no-cache-idle-slots", "--ui-mcp-proxy", "--tools", "all", "--tools-runtime", "x",
           "--mcp-servers-config", "c.json", "--mcp-servers-json", "{}", "--backend_sampling"]


def _stream(url: str, key: str, started: threading.Event) -> None:
    import httpx

    try:
        with httpx.stream("POST", url + "/completion", timeout=30,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"prompt": "Count: 1, 2, 3,", "n_predict": 400, "stream": True}) as r:
            for _ in r.iter_lines():
                started.set()
    except Exception:  # the server goes away under us: that is the point
        started.set()


@pytest.mark.model
def test_harness_command_line_starts_and_shuts_down_fast():
    import httpx

    from ngramspec.server.launch import start_server

    sp = start_server(HARNESS, timeout=180)
    try:
        h = {"Authorization": "Bearer sk-test"}
        assert httpx.get(sp.url + "/v1/models", headers=h).json()["data"][0]["id"] == "tinyllama-2"
        assert httpx.get(sp.url + "/slots", headers=h).status_code == 501
        r = httpx.post(sp.url + "/v1/chat/completions", headers=h, timeout=60,
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert r.status_code == 200 and r.json()["model"] == "tinyllama-2", r.text
        events = [threading.Event(), threading.Event()]
        clients = [threading.Thread(target=_stream, args=(sp.url, "sk-test", e)) for e in events]
        for t in clients:
            t.start()
        assert all(e.wait(60) for e in events)  # both requests are generating
        took = sigterm_seconds(sp.proc, clients)
    finally:
        sp.stop()
    log = sp.log()
    assert took < 1.0, f"shutdown took {took:.2f} s:\n{log}"
    assert "CancelledError" not in log and "Traceback" not in log, log
    warned = [ln for ln in log.splitlines() if "ngramspec serve: warning:" in ln]
    for flag in ("--lora", "--hf-repo", "--grp-attn-n", "--rerank"):
        assert sum(f" {flag}:" in ln for ln in warned) == 1, (flag, warned)
    assert "-fa off would break exactness" in log


@pytest.mark.model
def test_embeddings_endpoints():
    import numpy as np
    from fastapi.testclient import TestClient

    from ngramspec.server.app import create_app

    threads = int(os.environ.get("NGRAMSPEC_TEST_THREADS", "2"))
    s = ServerSettings(embedding=True, pooling="mean", n_ctx=512, threads=threads,
                       spec=SpecConfig(types=()))
    with TestClient(create_app(s, load_async=False)) as c:
        r = c.post("/v1/embeddings", json={"input": ["hello world", "goodbye"]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [d["index"] for d in body["data"]] == [0, 1] and body["usage"]["prompt_tokens"] > 2
        vecs = [np.asarray(d["embedding"]) for d in body["data"]]
        assert all(abs(np.linalg.norm(v) - 1.0) < 1e-4 for v in vecs)
        assert not np.allclose(vecs[0], vecs[1])
        again = c.post("/v1/embeddings", json={"input": "hello world"}).json()["data"][0]
        assert np.allclose(again["embedding"], vecs[0], atol=1e-6)  # deterministic
        native = c.post("/embedding", json={"content": "hello world"}).json()
        assert native[0]["index"] == 0 and np.allclose(native[0]["embedding"][0], vecs[0], atol=1e-6)


def test_docs_flag_table_is_current():
    script = Path(__file__).resolve().parent.parent / "scripts" / "server_flags_doc.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert r.returncode == 0, "docs/server-flags.md is stale: run python scripts/server_flags_doc.py"


def test_fa_spellings_of_llama_cpp():
    for value, want in (("on", "on"), ("enabled", "on"), ("0", "off"), ("false", "off"), ("auto", "auto")):
        assert ServerSettings(flash_attn=value).flash_attn == want
        v = parse("-fa", value)
        click_options.pop_unused(v)
        assert typed(v, serve=True).server.flash_attn == want


def test_bench_parallel_passes_load_spec_and_draft_flags_to_both_servers(monkeypatch, tmp_path):
    """`bench --parallel` hands the load, -md and spec flags the user gave to ngramspec's
    server and (without ngramspec's own flags) to llama-server."""
    from ngramspec.bench import pipeline as pipeline_bench
    from ngramspec.cli.main import main

    seen = {}

    def fake_run(*a, server_args=(), peer_args=(), **kw):
        seen["server"], seen["peer"] = list(server_args), list(peer_args)
        raise click.exceptions.Exit(0)  # no servers started

    monkeypatch.setattr(pipeline_bench, "run", fake_run)
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    r = CliRunner().invoke(main, ["bench", "--parallel", "1", "-ub", "256", "-md", str(draft),
                                  "--no-mmap", "--draft-max", "16", "--spec-ngram-size-n", "8",
                                  "--draft-policy", "fixed", "-t", "2"], obj={})
    assert r.exit_code == 0, r.output
    want = ["--model-draft", str(draft), "--ubatch-size", "256", "--no-mmap", "--draft-max", "16",
            "--spec-ngram-size-n", "8"]
    assert sorted(seen["peer"]) == sorted(want)
    assert sorted(seen["server"]) == sorted(want + ["--draft-policy", "fixed"])


def test_draft_policy_fixed_is_kept_with_auto():
    """`serve --draft-policy fixed` on the default type auto runs llama.cpp's chain of
    auto's drafters (it used to run the cost policy without a word); auto alone, or with
    the default --draft-policy, takes the cost policy."""
    from ngramspec.speculative.drafters.chain import AUTO_CANDIDATES, DrafterChain

    def spec(*args):
        v = parse(*args)
        click_options.pop_unused(v)
        return typed(v, serve=True).server.spec

    fixed = spec("--draft-policy", "fixed")
    assert fixed.types == ("auto",) and fixed.policy == "fixed"
    assert [d.name for d in DrafterChain(fixed).drafters] == [k[2] for k in AUTO_CANDIDATES]
    assert spec().policy == "cost" and spec("--spec-type", "auto").policy == "cost"
    assert spec("--spec-type", "ngram-mod", "--draft-policy", "fixed").policy == "fixed"
