"""ValDecay (qknorm_fairseq/lr_scheduler.py): closed forms and the decay rule (real fairseq-train
runs: tests/integration/test_val_decay.py)."""

import pytest
import torch
from fairseq.optim import FairseqOptimizer

from qknorm_fairseq.lr_scheduler import ValDecayConfig, ValDecaySchedule, active_scheduler


class _Opt(FairseqOptimizer):
    def __init__(self):
        super().__init__(None)
        self._optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)


def make(maximize=True, **kw):
    kw.setdefault("lr", [1e-3])
    kw.setdefault("stop_min_lr", -1.0)
    cfg = ValDecayConfig(maximize_best_checkpoint_metric=maximize, best_checkpoint_metric="bleu", **kw)
    return ValDecaySchedule(cfg, _Opt())


def test_warmup_and_flat_closed_form():
    s = make(warmup_updates=100, lr=[2e-3])
    for n in range(0, 300, 7):
        expected = 2e-3 * n / 100 if n < 100 else 2e-3
        assert s.step_update(n) == pytest.approx(expected, rel=1e-12, abs=1e-18)
        assert s.optimizer.get_lr() == s.lr


def test_warmup_from_given_init_lr():
    s = make(warmup_updates=10, lr=[1e-3], warmup_init_lr=1e-4)
    assert s.step_update(0) == pytest.approx(1e-4)
    assert s.step_update(5) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert s.step_update(10) == pytest.approx(1e-3)


def naive_decays(values, maximize, patience, factor, peak):
    """Independent restatement of TwT's rule: decay when the value is worse than all previous `patience`."""
    lr, out = peak, []
    for i, v in enumerate(values):
        prev = values[max(0, i - patience):i]
        if len(prev) == patience and (all(v < p for p in prev) if maximize else all(v > p for p in prev)):
            lr *= factor
        out.append(lr)
    return out


@pytest.mark.parametrize("maximize", [True, False])
def test_decay_rule_both_directions(maximize):
    bleu_like = [10, 12, 13, 12.5, 11.9, 14, 14, 13.9, 13.8, 13.7, 20, 5]
    values = bleu_like if maximize else [-v for v in bleu_like]  # a loss that mirrors the BLEU curve
    s = make(maximize=maximize, warmup_updates=0, decay_factor=0.5)
    lrs = [s.on_validation(v, num_updates=100 * (i + 1)) for i, v in enumerate(values)]
    assert lrs == pytest.approx(naive_decays(values, maximize, 3, 0.5, 1e-3))
    # by hand: 11.9 < min(12, 13, 12.5); 13.8 < min(14, 14, 13.9); 13.7 < min(14, 13.9, 13.8); 5.
    # 12.5 (not below 10) and the repeated 14 do not decay.
    assert s.decay_updates == [500, 900, 1000, 1200]


@pytest.mark.parametrize("maximize", [True, False])
def test_no_decay_while_improving(maximize):
    # the bug of a public fork: a decay that fires while the metric improves
    values = [1, 2, 3, 4, 5, 6, 7, 8] if maximize else [8, 7, 6, 5, 4, 3, 2, 1]
    s = make(maximize=maximize, warmup_updates=0)
    for i, v in enumerate(values):
        s.on_validation(v, i + 1)
    assert s.decay_updates == [] and s.lr == 1e-3


def test_no_decay_during_warmup_but_history_kept():
    s = make(warmup_updates=1000, decay_factor=0.5)
    for i, v in enumerate([10, 9, 8, 7, 6]):  # getting worse all along, inside warmup
        assert s.on_validation(v, num_updates=100 * (i + 1)) == pytest.approx(1e-3 * (i + 1) / 10)
    assert s.decay_updates == []
    s.on_validation(5, num_updates=1000)  # warmup over; worse than the previous 3 (all in warmup)
    assert s.decay_updates == [1000] and s.lr == pytest.approx(5e-4)


def test_step_skips_values_already_fed_by_the_task():
    s = make(warmup_updates=0)
    for i, v in enumerate([5, 4, 3]):
        s.step_update(10 * (i + 1))
        s.on_validation(v, 10 * (i + 1))
    s.step(epoch=1, val_loss=3)  # fairseq's end-of-pass call for the validation at update 30
    assert s.history == [5, 4, 3]
    s.step_update(31)
    s.step(epoch=2, val_loss=2)  # a value the task did not feed (plain `translation` task)
    assert s.history == [5, 4, 3, 2] and s.decay_updates == [31]


def test_bad_config_errors():
    with pytest.raises(ValueError, match="use --decay-stop-lr 1e-05 instead"):
        make(warmup_updates=100, stop_min_lr=1e-5)
    with pytest.raises(ValueError, match="--decay-factor"):
        make(decay_factor=1.5)
    with pytest.raises(ValueError, match="one --lr"):
        make(lr=[1e-3, 2e-3])


def test_lr_over_a_run_with_validations():
    """The LR the optimizer holds at every update of a run validated every 50 updates, against
    lr(n) = peak * n / warmup for n < warmup, then peak * factor ** (decays before n)."""
    s = make(warmup_updates=100, lr=[2e-3], decay_factor=0.5)
    assert active_scheduler() is s  # the one the task's post_validate hook feeds
    bleu = {50: 10, 100: 12, 150: 11, 200: 11.5, 250: 9, 300: 8, 350: 12}
    decays = [250, 300]  # by hand: 9 < min(12, 11, 11.5), 8 < min(11, 11.5, 9); 12 is not
    for n in range(1, 401):
        s.step_update(n)
        expected = 2e-3 * n / 100 if n < 100 else 2e-3 * 0.5 ** sum(d < n for d in decays)
        assert s.optimizer.get_lr() == pytest.approx(expected, rel=1e-12), n
        if n in bleu:
            s.on_validation(bleu[n], n)
    assert s.decay_updates == decays
