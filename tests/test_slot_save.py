"""POST /slots/{id}?action=save|restore|erase (llama-server's --slot-save-path), POST /props.

The app runs in-process on the embedded model (greedy). A restored slot's prompt
cache is reused by the next request, and its output equals a fresh prefill's
(docs/exactness.md, "Slot files").
"""
from __future__ import annotations

import os
import struct
import time

import pytest

from ngramspec.settings.config import SpecConfig, parse_spec_types
from ngramspec.settings.sampling import SamplingParams
from ngramspec.settings.server import ServerSettings
from ngramspec.server.slot_actions import valid_filename
from ngramspec.llama.twin import repack_is_safe

PROMPT = ("Summarize the following notes in one sentence.\n"
          + "".join(f"Note {i}: the shipment of item {i * 7} arrived on day {i + 3}.\n"
                    for i in range(8)))
OTHER = "Write a short poem about the sea, the wind and the gulls that fly above the waves."
N = 12


def client(**kw):
    from fastapi.testclient import TestClient

    from ngramspec.server.app import create_app

    threads = int(os.environ.get("NGRAMSPEC_TEST_THREADS", "2"))
    s = ServerSettings(n_ctx=1024, n_parallel=2, threads=threads,
                       sampling=SamplingParams(temperature=0.0), spec=SpecConfig(types=parse_spec_types("ngram-mod")), **kw)
    return TestClient(create_app(s, load_async=False))


def complete(c, prompt, slot, **body):
    r = c.post("/completion", json={"prompt": prompt, "id_slot": slot, "n_predict": N,
                                    "return_tokens": True, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_filenames_as_llama_cpp():
    for ok in ("slot1.bin", "a b.bin", "état.bin", ".hidden"):
        assert valid_filename(ok), ok
    for bad in ("", ".", "..", "../x.bin", "a/b.bin", "a\\b", "x..y", "c:d", "a?", "t\n",
                " lead", "trail ", "dot.", "\ud800", "x" * 256, None, 3):
        assert not valid_filename(bad), bad


def test_token_payload_is_llama_servers():
    import numpy as np

    from ngramspec.engine.slot_state import SlotFileError, pack, unpack

    toks = np.array([2, 100, 7], np.int32)
    assert pack(toks).tolist() == [-1, 1, 3, 2, 100, 7, 0]  # NULL, version, n, tokens, 0 media
    assert unpack(pack(toks)).tolist() == [2, 100, 7]
    assert unpack(toks).tolist() == [2, 100, 7]  # a plain list (older servers)
    assert unpack(np.zeros(0, np.int32)).tolist() == []
    for words, why in (([-1, 2, 0, 0], "version"), ([-1, 1, 1, 5, 1, 0], "mmproj"),
                       ([-1, 1, 3, 5], "truncated"), ([-1, 1, 0, 0, 9], "Trailing")):
        with pytest.raises(SlotFileError, match=why):
            unpack(np.array(words, np.int32))


@pytest.mark.model
def test_slot_actions_need_a_save_path_and_props_flag():
    with client() as c:
        r = c.post("/slots/0?action=save", json={"filename": "x.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
        assert c.post("/props", json={}).status_code == 501
    with client(props=True) as c:
        r = c.post("/props", json={"n_predict": 3})
        assert r.status_code == 200 and r.json() == {"success": True}


@pytest.mark.model
def test_save_restore_erase(tmp_path):
    with client(slot_save_path=str(tmp_path)) as c:
        for body in ({"filename": "../x.bin"}, {"filename": "a/b"}, {"filename": ".."}, {}):
            r = c.post("/slots/1?action=save", json=body)
            assert r.status_code == 400, (body, r.text)
        assert c.post("/slots/1?action=nothing", json={"filename": "x"}).status_code == 400
        assert c.post("/slots/x?action=erase").status_code == 400

        first = complete(c, PROMPT, 1)
        n_prompt = first["timings"]["prompt_n"]
        assert n_prompt >= 64 and first["timings"]["cache_n"] == 0 and first["id_slot"] == 1
        r = c.post("/slots/1?action=save", json={"filename": "slot1.bin"}).json()
        assert r["id_slot"] == 1 and r["filename"] == "slot1.bin"
        assert r["n_saved"] == n_prompt + N - 1  # the KV: prompt + output but the last token
        assert r["n_written"] == (tmp_path / "slot1.bin").stat().st_size
        assert r["timings"]["save_ms"] > 0
        saved = r

        complete(c, OTHER, 1)  # slot 1 now caches something else
        r = c.post("/slots/0?action=restore", json={"filename": "slot1.bin"}).json()
        assert r == {**r, "id_slot": 0, "n_restored": saved["n_saved"],
                     "n_read": saved["n_written"]}
        again = complete(c, PROMPT, 0)  # the restored KV is the prompt cache
        assert again["timings"]["cache_n"] == n_prompt - 1 and again["timings"]["prompt_n"] == 1
        assert again["tokens"] == first["tokens"]

        longer = PROMPT + "Note 8: the last shipment arrived on day 11.\n"
        c.post("/slots/0?action=restore", json={"filename": "slot1.bin"})
        hit = complete(c, longer, 0)
        fresh = complete(c, longer, 1, cache_prompt=False)
        # with a prefill twin the main context's cell of the prompt's last token is its
        # own (twin.py), so a restored slot reuses the cells before it
        reused = n_prompt - 1 if repack_is_safe() else n_prompt
        assert hit["timings"]["cache_n"] == reused and fresh["timings"]["cache_n"] == 0
        assert hit["tokens"] == fresh["tokens"]  # restored prefix == fresh prefill

        r = c.post("/slots/2?action=erase").json()  # ids wrap around, as in llama-server
        t = hit["timings"]
        assert r == {"id_slot": 0, "n_erased": t["cache_n"] + t["prompt_n"] + N - 1}
        assert complete(c, PROMPT, 0)["timings"]["cache_n"] == 0


@pytest.mark.model
def test_restore_plain_token_list_and_bad_files(tmp_path):
    """A file whose words are a plain token list (older llama-server) restores; a
    missing or corrupt file is a 400 and leaves the slot empty and usable."""
    with client(slot_save_path=str(tmp_path)) as c:
        first = complete(c, PROMPT, 1)
        n_saved = c.post("/slots/1?action=save", json={"filename": "s.bin"}).json()["n_saved"]
        path = tmp_path / "s.bin"
        data = bytearray(path.read_bytes())
        words = struct.unpack_from("=I", data, 8)[0]
        assert words == n_saved + 4 and struct.unpack_from("=iII", data, 12) == (-1, 1, n_saved)
        plain = data[:12] + data[24:24 + 4 * n_saved] + data[12 + 4 * words:]
        struct.pack_into("=I", plain, 8, n_saved)
        path.write_bytes(plain)
        r = c.post("/slots/0?action=restore", json={"filename": "s.bin"})
        assert r.status_code == 200 and r.json()["n_restored"] == n_saved
        again = complete(c, PROMPT, 0)
        assert again["timings"]["cache_n"] > 0 and again["tokens"] == first["tokens"]

        (tmp_path / "junk.bin").write_bytes(b"not a state file at all")
        for name in ("missing.bin", "junk.bin"):
            r = c.post("/slots/0?action=restore", json={"filename": name})
            assert r.status_code == 400 and "Unable to restore slot" in r.json()["error"]["message"]
        after = complete(c, PROMPT, 0)
        assert after["timings"]["cache_n"] == 0 and after["tokens"] == first["tokens"]


def test_save_path_must_be_a_directory(tmp_path):
    from click import BadParameter

    from ngramspec.errors import ConfigError

    assert ServerSettings(slot_save_path=str(tmp_path)).slot_save_path == str(tmp_path)
    with pytest.raises(ConfigError, match="not a directory"):
        ServerSettings(slot_save_path=str(tmp_path / "nope"))
    from ngramspec.server.command import serve

    with pytest.raises(BadParameter, match="not a directory"):
        serve.make_context("serve", ["--slot-save-path", str(tmp_path / "nope")], obj={})


@pytest.mark.model
def test_action_on_a_busy_slot_waits_for_its_request(tmp_path):
    """As llama-server, an action on a slot that is generating runs when it is done."""
    from concurrent.futures import ThreadPoolExecutor

    with client(slot_save_path=str(tmp_path)) as c, ThreadPoolExecutor(1) as ex:
        running = ex.submit(complete, c, PROMPT, 0, n_predict=48)
        while not c.get("/slots").json()[0]["is_processing"] and not running.done():
            time.sleep(0.02)
        r = c.post("/slots/0?action=save", json={"filename": "busy.bin"})
        done = running.result()
    assert r.status_code == 200
    assert r.json()["n_saved"] == done["timings"]["prompt_n"] + 48 - 1
