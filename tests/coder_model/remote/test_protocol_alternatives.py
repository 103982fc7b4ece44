"""A remote server's check of the memory's proposals comes back with every proposal's own
confidence (`proposal_confidences` of a result), so the editor lists alternatives in remote mode
too; a result without it (an older server) decodes as before, and a malformed one is refused."""

from __future__ import annotations

import msgpack
import pytest
from dlm.coder_model import limits
from dlm.coder_model.remote.wire import ProtocolError, prediction_from_wire, result_message
from dlm.coder_model.types import Prediction


def _wire(msg: dict) -> dict:
    return msgpack.unpackb(msgpack.packb(msg), raw=False)  # lists come back as lists, as on a socket


def test_proposal_confidences_roundtrip():
    pred = Prediction(text="x = f(a)", steps=2, confidence=0.8,
                      proposal_confidences=(("f(a)", 0.8), ("g(a, b)", 0.55)))
    msg = _wire(result_message(3, pred))
    assert msg["proposal_confidences"] == [["f(a)", 0.8], ["g(a, b)", 0.55]]
    assert prediction_from_wire(msg) == pred


def test_a_result_without_them_decodes_with_none_and_an_empty_ranking_is_not_sent():
    msg = _wire(result_message(3, Prediction(text="y", steps=1)))
    assert "proposal_confidences" not in msg
    assert prediction_from_wire(msg).proposal_confidences == ()


@pytest.mark.parametrize("bad", [
    "f(a)", [["f(a)"]], [["f(a)", 1.5]], [["f(a)", "high"]], [[3, 0.5]], [["f(a)", True]],
    [["x" * (limits.MAX_PROPOSAL_CHARS + 1), 0.5]], [["f(a)", 0.5]] * (limits.MAX_PROPOSALS + 1),
])  # fmt: skip
def test_malformed_proposal_confidences_are_refused(bad):
    msg = result_message(3, Prediction(text="y"))
    msg["proposal_confidences"] = bad
    with pytest.raises(ProtocolError) as err:
        prediction_from_wire(msg)
    assert err.value.code == "bad_frame" and "proposal_confidences" in err.value.message


def test_an_invalid_ranking_from_an_engine_is_left_out_rather_than_sent():
    msg = result_message(3, Prediction(text="y", proposal_confidences=(("f(a)", float("nan")),)))
    assert "proposal_confidences" not in msg
