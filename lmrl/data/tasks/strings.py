"""Character tasks: reverse a word (`reverse abcde` -> `edcba`), count a letter (`count a in banana` -> `3`)."""

from __future__ import annotations

import dataclasses
import random
import string

from lmrl.data.tasks.base import Example, Task, extract_answer, parse_int


def _check_lengths(task: str, min_len: int, max_len: int, alphabet: str) -> None:
    if not 1 <= min_len <= max_len <= 100:
        raise ValueError(f"{task}: need 1 <= min_len <= max_len <= 100, got {min_len}, {max_len}.")
    if not alphabet or not all(c.isascii() and c.isprintable() and not c.isspace() for c in alphabet):
        raise ValueError(f"{task}: alphabet must be non-empty printable ASCII without spaces, got {alphabet!r}.")


@dataclasses.dataclass
class Reverse(Task):
    """Reverse a random word of `min_len`..`max_len` letters drawn from `alphabet`."""

    name = "reverse"
    min_len: int = 3
    """shortest word"""
    max_len: int = 6
    """longest word"""
    alphabet: str = string.ascii_lowercase
    """letters words are drawn from"""

    def __post_init__(self) -> None:
        _check_lengths(self.name, self.min_len, self.max_len, self.alphabet)

    def sample(self, rng: random.Random) -> Example:
        word = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(self.min_len, self.max_len)))
        return Example(self.name, f"reverse {word}", word[::-1], {"word": word})

    def parse(self, completion: str) -> str | None:
        text = extract_answer(completion)
        return text if text else None


@dataclasses.dataclass
class Count(Task):
    """Count the occurrences of a letter in a random word, e.g. `count a in abcab` -> `2`."""

    name = "count"
    min_len: int = 4
    """shortest word"""
    max_len: int = 10
    """longest word"""
    alphabet: str = "abcd"
    """letters words are drawn from (a small alphabet gives non-trivial counts)"""

    def __post_init__(self) -> None:
        _check_lengths(self.name, self.min_len, self.max_len, self.alphabet)

    def sample(self, rng: random.Random) -> Example:
        word = "".join(rng.choice(self.alphabet) for _ in range(rng.randint(self.min_len, self.max_len)))
        letter = rng.choice(self.alphabet)
        return Example(
            self.name, f"count {letter} in {word}", str(word.count(letter)), {"word": word, "letter": letter}
        )

    def parse(self, completion: str) -> str | None:
        value = parse_int(extract_answer(completion))
        return None if value is None else str(value)
