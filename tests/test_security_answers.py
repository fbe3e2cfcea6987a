"""Hostile engine and teacher answers (slick/engines/answer_check.py): a real loopback HTTP server answers
/generate with bytes that are not UTF-8, JSON of the wrong shape, logprobs above 0, NaN or infinite; the HTTP engine
(--rollout-engine http) and the on-policy distillation teacher (--opd-teacher-url) refuse each with an EngineError
naming the server's URL and what was wrong, never a UnicodeDecodeError and never a tensor holding +5.0 or NaN."""
import asyncio
import http.server
import json
import threading

import pytest

from slick.engines.client import EngineError, HttpEngine
from slick.train.opd_teacher import EngineTeacher
from slick.types import Sample, SamplingParams

pytestmark = pytest.mark.timeout(60)


class _Hostile(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = self.server.answer
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def hostile():
    """A real HTTP server on a free loopback port; ``srv.answer`` (bytes) is what every POST gets."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    srv.answer = b"{}"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def _gen_answer(lps, ids=(5, 6), raw_lps=None) -> bytes:
    meta = {"finish_reason": {"type": "length"}, "prompt_tokens": 3, "weight_version": "0",
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)]}
    text = json.dumps({"text": "ab", "output_ids": list(ids), "meta_info": meta})
    for k, v in (raw_lps or {}).items():
        text = text.replace(k, v)
    return text.encode()


def _generate(url):
    async def go():
        eng = HttpEngine([url], max_retries=0)
        try:
            return await eng.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        finally:
            await eng.close()
    return asyncio.run(go())


GENERATE_CASES = {   # answer -> what the error says after "URL/generate: "
    "not_utf8": (b'{"text": "\xff\xfe", "meta_info": {}}', "the answer is not UTF-8 text (byte 10 of 31: "
                 "b'\\xff\\xfe\", \"me')"),
    "plus_five": (_gen_answer([-0.5, 5.0]), "unusable answer: AnswerError: the logprob of output token 1 is 5.0: "
                  "a logprob must be a finite number <= 0"),
    "nan": (_gen_answer([-0.5, 123.0], raw_lps={"123.0": "NaN"}), "unusable answer: AnswerError: the logprob of "
            "output token 1 is nan"),
    "inf": (_gen_answer([-0.5, 123.0], raw_lps={"123.0": "-Infinity"}), "the logprob of output token 1 is -inf"),
    "shape": (_gen_answer([-0.5], ids=(5, 6)).replace(b'"output_ids": [5, 6]', b'"output_ids": [5, 6, 7]'),
              "unusable answer: AnswerError: 1 logprobs for 3 tokens"),
    "not_json": (b'{"text": ', "Expecting value: line 1 column 10"),
}


@pytest.mark.parametrize("kind", sorted(GENERATE_CASES))
def test_http_engine_refuses_a_hostile_generate_answer_naming_the_server(hostile, kind):
    hostile.answer, says = GENERATE_CASES[kind]
    with pytest.raises(EngineError) as e:
        _generate(_url(hostile))
    msg = str(e.value)
    assert msg.startswith(f"{_url(hostile)}/generate: ") and says in msg, msg


def test_http_engine_takes_a_well_formed_answer(hostile):
    hostile.answer = _gen_answer([-0.5, -0.05])
    gen = _generate(_url(hostile))
    assert gen.token_ids == [5, 6] and gen.logprobs == [-0.5, -0.05]


def _prompt_answer(lps) -> bytes:
    """A /generate answer with prompt logprobs for ids 1, 2, 3, 4 (the first position scores nothing)."""
    tokens = [[None, 1, None]] + [[lp, t, None] for lp, t in zip(lps, (2, 3, 4))]
    return json.dumps({"text": "", "meta_info": {"input_token_logprobs": tokens, "finish_reason": {"type": "length"}}},
                      allow_nan=True).encode()


def _teacher(url):
    async def go():
        teacher = EngineTeacher(HttpEngine([url], max_retries=0))
        try:
            return await teacher.score([Sample(index=7, prompt_ids=[1, 2], response_ids=[3, 4])])
        finally:
            await teacher.close()
    return asyncio.run(go())


@pytest.mark.parametrize("lps, says", [
    ([-1.0, -0.5, 5.0], "prompt logprobs position 2, token 4 is 5.0: a logprob must be a finite number <= 0"),
    ([-1.0, float("nan"), -0.5], "prompt logprobs position 1, token 3 is nan"),
    ([-1.0, -0.5, float("inf")], "prompt logprobs position 2, token 4 is inf"),
])
def test_teacher_answers_are_checked_naming_the_teacher(hostile, lps, says):
    hostile.answer = _prompt_answer(lps)
    with pytest.raises(EngineError) as e:
        _teacher(_url(hostile))
    msg = str(e.value)
    assert msg.startswith(f"{_url(hostile)}/generate: unusable answer: AnswerError: ") and says in msg, msg


def test_teacher_non_utf8_and_good_answers(hostile):
    hostile.answer = _prompt_answer([-1.0, -0.5, -0.25]).replace(b'"text": ""', b'"text": "\xc3\x28"')
    with pytest.raises(EngineError, match=r"/generate: the answer is not UTF-8 text \(byte 10 of"):
        _teacher(_url(hostile))
    hostile.answer = _prompt_answer([-1.0, -0.5, -0.25])
    (scores,) = _teacher(_url(hostile))
    assert scores.tolist() == [-0.5, -0.25]      # the response tokens 3, 4: positions 1 and 2
