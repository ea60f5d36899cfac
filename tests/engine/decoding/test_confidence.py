import numpy as np

from engine.decoding import decoders
from engine.decoding.decoders import SURE, Confidence, is_sure, probability


def test_sure_is_the_softmax_probability_at_least_sure_whether_or_not_a_close_second_logit_rules_it_out():
    rng = np.random.default_rng(7)
    verdicts, ruled_out = [], 0
    for k in range(400):
        row = (rng.standard_normal(5000) * rng.uniform(0.5, 4.0)).astype(np.float32)
        top = int(np.argmax(row))
        row[top] += rng.uniform(0.0, 14.0)  # from a near tie to a sure token
        if k % 3 == 0:  # a second logit close to the top one
            row[(top + 1) % row.size] = row[top] - rng.uniform(0.0, 3.0)
        token = top if k % 5 else int(rng.integers(row.size))  # now and then a token the model did not favour
        verdicts.append(is_sure(row, token))
        p = probability(row, token)
        assert verdicts[-1] == (p >= SURE)
        ruled_out += int(np.sort(row)[-2] > row[token] + np.log((1 - SURE) / SURE) + 1e-3)
    assert 50 < sum(verdicts) < 350  # both answers were tested
    assert 50 < ruled_out < 350 - sum(verdicts)  # some without a softmax, some with one that said no


def test_confidence_reads_the_row_once_and_keeps_its_answer():
    row = np.zeros(10, dtype=np.float32)
    row[3] = 10.0
    confidence = Confidence(row, 3)
    assert confidence() is True
    row[4] = 10.0  # the logits buffer is reused by the next decode
    assert confidence() is True
    assert Confidence(row, 3)() is False
    assert decoders.NO_CONFIDENCE() is False
