"""The divergence guard: a finite divergence (the loss far above where training started) stops or warns.

Two rules, with these defaults (``TrainConfig.on_divergence``, ``loss_rise_margin``, ``loss_rise_patience``):

* **Above ln V** (V = vocab size; ln V is the cross-entropy of a uniform prediction, about where a freshly
  initialised model starts: ln V plus about half the variance of its initial logits, under 0.5 nats for the presets):
  a validation loss more than ``LN_VOCAB_MARGIN`` (1 nat) above ln V — the periodic one (``eval_every``) or the one
  measured for a checkpoint — means the model predicts clearly worse than knowing nothing. It counts once the guard
  is *armed*: after a validation loss below ln V, or past warm-up, whichever comes first. The margin keeps short runs
  whose loss still hovers at ln V (a few steps in CI) from stopping; a real divergence goes far beyond it (at a
  too-high learning rate the tiny preset goes 6.04 → 7.52 at V = 512, the issue's run 12 → 90 at V = 151,936).
  ``on_divergence="stop"`` raises ``DivergenceError`` (nothing of that step is saved; the best checkpoint stays);
  ``"warn"`` says so in one line, once until the loss is back under the threshold. Only validation losses count: one
  bad training batch cannot stop a run.
* **Sustained rise**: the training loss smoothed by an exponential moving average (``LOSS_EMA_DECAY`` per step),
  sampled at each periodic evaluation, that stays more than ``loss_rise_margin`` nats above its running minimum at
  ``loss_rise_patience`` consecutive evaluations warns in one line (once per episode). It never stops a run: a
  loss spike decays out of the average within a few evaluations.

``Guard`` holds the state (saved in ``trainer_state.pt`` so a resumed run judges as the uninterrupted one) and
decides; the training loop makes the ranks agree and raises or logs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

#: Weight of the previous average in the smoothed training loss (per optimizer step): ``ema = 0.9 · ema + 0.1 ·
#: loss``, a half-life of about 6.6 steps; the first finite loss starts it.
LOSS_EMA_DECAY = 0.9
#: Nats above ln V at which a validation loss counts as divergence.
LN_VOCAB_MARGIN = 1.0


class DivergenceError(FloatingPointError):
    """The validation loss rose more than ``LN_VOCAB_MARGIN`` above ln V (``TrainConfig.on_divergence="stop"``). The
    message is one line: the step, the value, ln V, the best checkpoint kept (with its validation loss) and what to
    do. ``step``, ``val_loss``, ``ln_vocab``, ``best_checkpoint`` (a path or None) and ``best_val_loss`` say the same
    as attributes."""

    def __init__(self, message: str, *, step: int, val_loss: float, ln_vocab: float,
                 best_checkpoint: str | None = None, best_val_loss: float | None = None):
        super().__init__(message)
        self.step, self.val_loss, self.ln_vocab = step, val_loss, ln_vocab
        self.best_checkpoint, self.best_val_loss = best_checkpoint, best_val_loss


@dataclass
class Guard:
    """The guard's settings and state. ``ln_vocab`` = ln V (nats); ``warmup_steps`` arms the ln V rule after them."""

    ln_vocab: float
    warmup_steps: int
    margin: float
    patience: int
    armed: bool = False
    above: bool = False  # the current validation loss is above ln V (said once per episode with "warn")
    ema: float | None = None
    ema_min: float | None = None
    ema_min_step: int = 0
    rise_evals: int = 0  # consecutive evaluations with the average more than ``margin`` above its minimum
    rise_warned: bool = False

    @classmethod
    def for_run(cls, vocab_size: int, warmup_steps: int, margin: float, patience: int, step: int,
                state: Mapping[str, Any] | None = None) -> "Guard":
        """A guard for a run at ``step``; ``state`` (a checkpoint's) restores it. Without one (a fresh run, or a
        checkpoint of an older release) it starts empty, armed when ``step`` is past warm-up."""
        g = cls(math.log(vocab_size), warmup_steps, float(margin), int(patience), armed=step > warmup_steps)
        for key in _STATE_KEYS & set(state or ()):
            setattr(g, key, state[key])
        return g

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (plain numbers and booleans)."""
        return {k: v for k, v in asdict(self).items() if k in _STATE_KEYS}

    def observe_train_loss(self, loss: float) -> None:
        """Fold one optimizer step's training loss into the moving average (a non-finite one is left out)."""
        if math.isfinite(loss):
            self.ema = loss if self.ema is None else LOSS_EMA_DECAY * self.ema + (1 - LOSS_EMA_DECAY) * loss

    @property
    def threshold(self) -> float:
        """ln V + ``LN_VOCAB_MARGIN``: the validation loss above which an armed guard sees divergence."""
        return self.ln_vocab + LN_VOCAB_MARGIN

    def above_ln_vocab(self, step: int, val_loss: float) -> bool:
        """Whether ``val_loss`` (measured after ``step``) counts as divergence; arms the guard on the way."""
        if val_loss < self.ln_vocab or step > self.warmup_steps:
            self.armed = True
        return self.armed and val_loss > self.threshold

    def first_above(self, diverged: bool) -> bool:
        """With ``"warn"``: whether to say it now (the first evaluation of an episode above ln V)."""
        first = diverged and not self.above
        self.above = diverged
        return first

    def rise_warning(self, step: int) -> str | None:
        """At a periodic evaluation: the one-line warning when the average has now stayed more than ``margin`` above
        its minimum at ``patience`` consecutive evaluations (once per episode), else None."""
        if self.ema is None or self.patience == 0:
            return None
        if self.ema_min is None or self.ema < self.ema_min:
            self.ema_min, self.ema_min_step = self.ema, step
        if self.ema > self.ema_min + self.margin:
            self.rise_evals += 1
        else:
            self.rise_evals, self.rise_warned = 0, False
        if self.rise_evals < self.patience or self.rise_warned:
            return None
        self.rise_warned = True
        return (f"warning: at step {step} the smoothed training loss {self.ema:.4f} (moving average, decay "
                f"{LOSS_EMA_DECAY} per step) has stayed more than {self.margin:g} nats above its minimum "
                f"{self.ema_min:.4f} (step {self.ema_min_step}) for {self.rise_evals} evaluations; the run "
                f"continues — check the learning rate and the data (TrainConfig.loss_rise_margin / "
                f"loss_rise_patience tune this warning)")


#: The fields of ``Guard`` a checkpoint keeps (``state``) and restores (``for_run``); the rest is the run's config.
_STATE_KEYS = frozenset({"armed", "above", "ema", "ema_min", "ema_min_step", "rise_evals", "rise_warned"})
