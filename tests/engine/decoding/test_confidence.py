import numpy as np

from engine.decoding import decoders
from engine.decoding.decoders import SURE_LEAD, Confidence, is_sure


def test_sure_means_the_token_led_every_other_logit_by_ln_sure_lead_which_every_token_of_p_0_9_does():
    rng = np.random.default_rng(7)
    verdicts = []
    for k in range(400):
        row = (rng.standard_normal(5000) * rng.uniform(0.5, 4.0)).astype(np.float32)
        top = int(np.argmax(row))
        row[top] += rng.uniform(0.0, 14.0)  # from a near tie to a sure token
        if k % 3 == 0:  # a second logit close to the top one
            row[(top + 1) % row.size] = row[top] - rng.uniform(0.0, 3.0)
        token = top if k % 5 else int(rng.integers(row.size))  # now and then a token the model did not favour
        verdicts.append(is_sure(row, token))
        others = np.delete(row, token)
        assert verdicts[-1] == bool(others.max() <= row[token] - np.log(SURE_LEAD))
        probability = 1.0 / np.exp(row.astype(np.float64) - row[token]).sum()
        if probability >= 0.9:
            assert verdicts[-1]
    assert 50 < sum(verdicts) < 350  # both answers were tested


def test_confidence_reads_the_row_once_and_keeps_its_answer():
    row = np.zeros(10, dtype=np.float32)
    row[3] = 10.0
    confidence = Confidence(row, 3)
    assert confidence() is True
    row[4] = 10.0  # the logits buffer is reused by the next decode
    assert confidence() is True
    assert Confidence(row, 3)() is False
    assert decoders.NO_CONFIDENCE() is False
