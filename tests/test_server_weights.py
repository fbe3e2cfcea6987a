"""`/update_weights_from_disk` on a real `slick serve`: a bad update is refused as a whole (4xx, weights and
version unchanged), and a good one still loads afterwards."""
import pytest

from slick.engines.router import launch_workers
from tests.bad_weights import BAD_DIRS
from tests.test_server import call, gen_body

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    (w,) = launch_workers(tiny_model_dir, 1, dtype="fp32", startup_timeout=240,   # weights from the tests' tmp dirs
                          extra_args=["--allowed-weight-dirs", str(tmp_path_factory.getbasetemp())])
    yield w
    w.stop()


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    from slick.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("other"), seed=123)


def _greedy(url):
    st, out = call(url, "/generate", gen_body(n=8))
    assert st == 200, out
    return out["output_ids"], [x[0] for x in out["meta_info"]["output_token_logprobs"]], \
        out["meta_info"]["weight_version"]


@pytest.mark.parametrize("name,build,words", BAD_DIRS, ids=[b[0] for b in BAD_DIRS])
def test_failed_update_is_4xx_and_changes_nothing(server, other, tmp_path, name, build, words):
    ids, lps, version = _greedy(server.url)
    bad = build(other, tmp_path / "bad")
    st, out = call(server.url, "/update_weights_from_disk", {"model_path": str(bad), "weight_version": "42"})
    assert call(server.url, "/get_weight_version")[1]["weight_version"] == version
    assert _greedy(server.url) == (ids, lps, version)         # same tokens, same logprobs, same version
    assert st == 400, out
    assert out["success"] is False
    assert all(w in out["message"] for w in words), out["message"]


def test_good_update_after_failures_loads(server, other, tiny_model_dir):
    ids, lps, version = _greedy(server.url)
    st, out = call(server.url, "/update_weights_from_disk", {"model_path": str(other)})
    assert st == 200 and out["success"] is True and out["weight_version"] == version + 1
    _, lps_other, v = _greedy(server.url)
    assert v == version + 1 and lps_other != pytest.approx(lps, abs=1e-3)
    st, out = call(server.url, "/update_weights_from_disk", {"model_path": str(tiny_model_dir)})
    assert st == 200 and out["weight_version"] == version + 2
    assert _greedy(server.url)[:2] == (ids, lps)
