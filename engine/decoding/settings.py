"""Settings of a generation: lookahead shape, sampling, stopping.

All of them are frozen dataclasses, so a running generation can be handed a new
value between two steps by plain assignment.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.llama.problems import SettingsError

# The context is created once for the largest shape these limits allow: the
# number of sequences (1 + G + W) and the batch size are fixed at creation.
MAX_WINDOW = 16
MAX_NGRAM = 8
MAX_GUESSES = 16
# Sampling limits: beyond them a setting only slows the sampler or wrecks the text.
MAX_TOP_K = 1000
MAX_REPEAT_PENALTY = 2.0
MAX_REPEAT_LAST_N = 4096
MAX_DRY_MULTIPLIER = 5.0
MAX_DRY_BASE = 4.0
MAX_NGRAM_REPEAT = 64


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
        if not 0 <= self.temperature <= 5:
            raise SettingsError(f"temperature {self.temperature} is out of range 0..5")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise SettingsError(f"top-k {self.top_k} is out of range 0..{MAX_TOP_K}")
        if not 0.0 < self.top_p <= 1.0:
            raise SettingsError(f"top-p {self.top_p} is out of range (0, 1]")
        if not 0.0 <= self.min_p < 1.0:
            raise SettingsError(f"min-p {self.min_p} is out of range [0, 1)")
        if not 0 <= self.seed < 2**32:
            raise SettingsError(f"seed {self.seed} is out of range 0..2^32-1")
        if not 1.0 <= self.repeat_penalty <= MAX_REPEAT_PENALTY:
            raise SettingsError(f"repeat penalty {self.repeat_penalty} is out of range 1..{MAX_REPEAT_PENALTY}")
        if not 0 <= self.repeat_last_n <= MAX_REPEAT_LAST_N:
            raise SettingsError(f"repeat window {self.repeat_last_n} is out of range 0..{MAX_REPEAT_LAST_N}")
        if not 0.0 <= self.dry_multiplier <= MAX_DRY_MULTIPLIER:
            raise SettingsError(f"DRY multiplier {self.dry_multiplier} is out of range 0..{MAX_DRY_MULTIPLIER}")
        if not 1.0 < self.dry_base <= MAX_DRY_BASE:
            raise SettingsError(f"DRY base {self.dry_base} is out of range (1, {MAX_DRY_BASE}]")
        if not 1 <= self.dry_allowed_length <= MAX_NGRAM_REPEAT:
            raise SettingsError(f"DRY allowed length {self.dry_allowed_length} is out of range 1..{MAX_NGRAM_REPEAT}")
        if not 0 <= self.dry_last_n <= MAX_REPEAT_LAST_N:
            raise SettingsError(f"DRY prompt window {self.dry_last_n} is out of range 0..{MAX_REPEAT_LAST_N}")
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
