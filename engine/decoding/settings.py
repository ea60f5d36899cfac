"""Settings of a generation: lookahead shape, sampling, stopping.

All of them are frozen dataclasses, so a running generation can be handed a new
value between two steps by plain assignment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.llama.problems import SettingsError

# The context is created once for the largest shape these limits allow: the
# number of sequences (1 + G + W) and the batch size are fixed at creation.
MAX_WINDOW = 16
MAX_NGRAM = 8
MAX_GUESSES = 16
# Sampling limits: beyond them a setting only slows the sampler or wrecks the text. Temperature stops where
# OpenAI's API does, so the app, the command line and the server take the same values.
MAX_TEMPERATURE = 2.0
MAX_TOP_K = 1000
MAX_REPEAT_PENALTY = 2.0
MAX_REPEAT_LAST_N = 4096
MAX_DRY_MULTIPLIER = 5.0
MAX_DRY_BASE = 4.0
MAX_NGRAM_REPEAT = 64


@dataclass(frozen=True)
class SettingRange:
    """The values one sampling setting may take: ``low`` to ``high``, an end left out where it is open.

    ``what`` names the setting in a refusal ("top-p 1.5 is out of range (0, 1]").
    """

    what: str
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = self.low < value if self.low_open else self.low <= value
        below = value < self.high if self.high_open else value <= self.high
        return above and below  # NaN is neither

    def __str__(self) -> str:
        low, high = _plain(self.low), _plain(self.high)
        if not (self.low_open or self.high_open):
            return f"{low}..{high}"
        return f"{'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _plain(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


# Every sampling setting's range, by its name in ``SamplingConfig``: what ``SamplingConfig.validate`` (and with it
# the app's settings and the command line) and the server's request checks (engine/server/requests.py) allow; the
# app's spin boxes stop at the same MAX_ values.
SAMPLING_RANGES: Mapping[str, SettingRange] = {
    "temperature": SettingRange("temperature", 0.0, MAX_TEMPERATURE),
    "top_k": SettingRange("top-k", 0, MAX_TOP_K),
    "top_p": SettingRange("top-p", 0.0, 1.0, low_open=True),
    "min_p": SettingRange("min-p", 0.0, 1.0, high_open=True),
    "seed": SettingRange("seed", 0, 2**32 - 1),
    "repeat_penalty": SettingRange("repeat penalty", 1.0, MAX_REPEAT_PENALTY),
    "repeat_last_n": SettingRange("repeat window", 0, MAX_REPEAT_LAST_N),
    "dry_multiplier": SettingRange("DRY multiplier", 0.0, MAX_DRY_MULTIPLIER),
    "dry_base": SettingRange("DRY base", 1.0, MAX_DRY_BASE, low_open=True),
    "dry_allowed_length": SettingRange("DRY allowed length", 1, MAX_NGRAM_REPEAT),
    "dry_last_n": SettingRange("DRY prompt window", 0, MAX_REPEAT_LAST_N),
}


@dataclass(frozen=True)
class LookaheadConfig:
    """Shape of one lookahead step.

    window:  W, Jacobi columns (0 turns the lookahead branch off).
    ngram:   N, n-gram length; each column carries N-1 levels and each
             verification candidate N-1 draft tokens.
    guesses: G, how many pool n-grams are verified per step (0 turns the
             verification branch off).
    auto:    let the decoder pick each step's shape (window and ngram are
             then the largest window it may run, guesses=0 turns drafts off;
             history drafts are sized by Auto, up to 15 tokens).
    """

    window: int = 0
    ngram: int = 4
    guesses: int = 3
    auto: bool = False

    def validate(self) -> LookaheadConfig:
        if not 0 <= self.window <= MAX_WINDOW:
            raise SettingsError(f"window W={self.window} is out of range 0..{MAX_WINDOW}")
        if not 2 <= self.ngram <= MAX_NGRAM:
            raise SettingsError(f"n-gram size N={self.ngram} is out of range 2..{MAX_NGRAM}")
        if not 0 <= self.guesses <= MAX_GUESSES:
            raise SettingsError(f"guesses G={self.guesses} is out of range 0..{MAX_GUESSES}")
        return self


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling settings; temperature 0 means greedy (argmax).

    top_k 0 and min_p 0 turn those filters off. repeat_penalty scales down the
    logits of the tokens among the last ``repeat_last_n`` (the prompt's tail
    included, as llama.cpp's own tools do); 1.0 or a window of 0 turns it off.
    It applies under greedy decoding too: the draw is then the argmax of the
    penalised logits.

    dry_multiplier > 0 turns on DRY ("don't repeat yourself", llama.cpp's
    sampler): a token that would extend a repeat of an earlier span longer than
    ``dry_allowed_length`` is penalised by multiplier * base^(length - allowed).
    It looks at the reply and the last ``dry_last_n`` tokens of the prompt
    (0: the reply only), so how much of the prompt a reply may copy freely is
    set here. Both penalties read one history (one llama.cpp sampler chain), so
    with the repeat penalty on too, DRY also sees its window of the prompt:
    ``prompt_tail`` is what both see.
    """

    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_last_n: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def penalized(self) -> bool:
        """True when the repetition penalty changes the logits."""
        return self.repeat_penalty != 1.0 and self.repeat_last_n > 0

    @property
    def dry(self) -> bool:
        return self.dry_multiplier > 0.0

    @property
    def prompt_tail(self) -> int:
        """How many of the prompt's last tokens the penalties see."""
        return max(self.repeat_last_n if self.penalized else 0, self.dry_last_n if self.dry else 0)

    @property
    def plain_argmax(self) -> bool:
        """True when the draw is the argmax of the raw logits: no sampler chain is needed."""
        return self.greedy and not self.penalized and not self.dry

    def describe(self, loop_guard: bool | None = None) -> str:
        """The settings in words, as a speed report states what it ran with: "greedy, repeat penalty 1.1 over
        the last 64 tokens, loop guard on"."""
        parts = ["greedy"] if self.greedy else [
            f"temperature {self.temperature:g}, seed {self.seed}"
            + "".join(f", {name} {value:g}" for name, value, on in (
                ("top-k", self.top_k, self.top_k > 0), ("top-p", self.top_p, self.top_p < 1.0),
                ("min-p", self.min_p, self.min_p > 0.0)) if on)]
        if self.penalized:
            parts.append(f"repeat penalty {self.repeat_penalty:g} over the last {self.repeat_last_n} tokens")
        if self.dry:
            seen = f"the reply and the prompt's last {self.prompt_tail} tokens" if self.prompt_tail else "the reply"
            parts.append(f"DRY {self.dry_multiplier:g} (base {self.dry_base:g}, {self.dry_allowed_length} tokens "
                         f"free) over {seen}")
        if loop_guard is not None:
            parts.append(f"loop guard {'on' if loop_guard else 'off'}")
        return ", ".join(parts)

    def validate(self) -> SamplingConfig:
        for name, allowed in SAMPLING_RANGES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise SettingsError(f"{allowed.what} {value} is out of range {allowed}")
        return self


@dataclass(frozen=True)
class StopConfig:
    """When a generation ends (besides end-of-generation tokens and cancel)."""

    max_tokens: int = 256
    stop_strings: tuple[str, ...] = field(default_factory=tuple)
    loop_guard: bool = False  # stop a reply that repeats one span over and over (engine/decoding/loops.py)

    def validate(self) -> StopConfig:
        if self.max_tokens < 1:
            raise SettingsError(f"max tokens {self.max_tokens} must be >= 1")
        return self


# Manual default for this kind of machine (2 cores), chosen from a measured
# grid (docs/SPEED.md, "Choosing W, N, G"): verification only, short drafts.
DEFAULT_FIXED = LookaheadConfig(window=0, ngram=2, guesses=1)
# Auto is the default: W and N here bound its window, G>0 lets it draft.
DEFAULT_LOOKAHEAD = LookaheadConfig(window=4, ngram=MAX_NGRAM, guesses=2, auto=True)

# What the app writes replies with until the user changes it; ``engine generate`` and ``engine bench`` start
# from the same. Chosen by measurement (docs/SPEED.md, "Choosing the sampler").
APP_SAMPLING = SamplingConfig(dry_multiplier=0.8)
APP_LOOP_GUARD = True
