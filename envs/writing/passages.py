"""The Writing-v0 task items: short passages composed from templates and word lists.

The passages are fictional and generated deterministically (fixed seed, Python's
``random.Random``), so the data file ``tasks.json`` that ships with the package can be
rebuilt byte for byte::

    python -m envs.writing.passages        # rewrites envs/writing/tasks.json

Each item: ``{"id": "writing-0000", "topic": "town", "passage": "..."}``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

DATA_FILE = Path(__file__).with_name("tasks.json")
NUM_PASSAGES = 320
SEED = 20240601

_SYLLABLES = ["bar", "ven", "lo", "mir", "tas", "el", "dor", "ka", "sil", "ran", "thu", "mo", "gal", "ne", "pri", "wen"]
_FIRST = [
    "Amara",
    "Jonas",
    "Lena",
    "Tomas",
    "Priya",
    "Mateo",
    "Ingrid",
    "Kofi",
    "Yuki",
    "Elena",
    "Farid",
    "Nora",
    "Owen",
    "Sofia",
    "Ravi",
    "Clara",
]
_LAST = [
    "Okafor",
    "Lindqvist",
    "Moreau",
    "Tanaka",
    "Herrera",
    "Novak",
    "Brennan",
    "Castell",
    "Duarte",
    "Holm",
    "Ivanova",
    "Kestrel",
]
_NUMBERS = ["two", "three", "four", "five", "six", "seven", "eight", "ten", "twelve"]


def _name(rng: random.Random, syllables: int = 2) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def _person(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"


def _town(rng: random.Random) -> str:
    return (
        f"{_name(rng)} is a {rng.choice(['small', 'quiet', 'busy', 'hillside', 'coastal'])} town on the banks of the "
        f"{_name(rng)} river. It is known for its {rng.choice(['woven baskets', 'blue pottery', 'smoked cheese', 'glass lanterns', 'wool blankets'])}, "
        f"which local families have made for {rng.choice(_NUMBERS)} generations. Every "
        f"{rng.choice(['spring', 'summer', 'autumn', 'winter'])}, the town holds a festival where visitors "
        f"{rng.choice(['watch boat races', 'taste the harvest', 'learn old songs', 'trade handmade goods'])}. "
        f"In recent years, {rng.choice(['a new bridge has brought more tourists', 'young people have moved to the city', 'a railway station reopened', 'floods have damaged the old market'])}."
    )


def _invention(rng: random.Random) -> str:
    device = rng.choice(["water clock", "folding bicycle", "solar kettle", "wind pump", "paper press", "signal lamp"])
    return (
        f"The {device} was first built by {_person(rng)} in {rng.randint(1780, 1990)}. It was designed to "
        f"{rng.choice(['save fuel in remote villages', 'help farmers water their fields', 'send messages across valleys', 'make printing cheaper'])}. "
        f"Early versions were {rng.choice(['heavy and hard to repair', 'expensive to build', 'unreliable in cold weather', 'slow and noisy'])}, "
        f"but later models {rng.choice(['used lighter metals', 'were sold as simple kits', 'worked in any season', 'ran twice as fast'])}. "
        f"Today the {device} is used mainly in {rng.choice(['schools', 'small workshops', 'mountain huts', 'museums'])}."
    )


def _animal(rng: random.Random) -> str:
    animal = f"{_name(rng).lower()} {rng.choice(['beetle', 'heron', 'lizard', 'fox', 'frog', 'owl'])}"
    return (
        f"The {animal} lives in {rng.choice(['dry grasslands', 'mangrove swamps', 'high pine forests', 'rocky islands'])}. "
        f"It feeds mostly on {rng.choice(['seeds and berries', 'small fish', 'insects', 'roots and leaves'])} and is most active "
        f"{rng.choice(['at dawn', 'at night', 'after rain', 'in the hottest hours'])}. Its most unusual trait is "
        f"{rng.choice(['a call that sounds like a bell', 'the ability to change colour', 'a nest built from mud and feathers', 'a memory for hundreds of hiding places'])}. "
        f"Because of {rng.choice(['new roads', 'warmer summers', 'farming', 'invasive rats'])}, its numbers have "
        f"{rng.choice(['fallen by half', 'slowly declined', 'recovered recently', 'become hard to measure'])}."
    )


def _scientist(rng: random.Random) -> str:
    return (
        f"{_person(rng)}, a {rng.choice(['chemist', 'geologist', 'botanist', 'astronomer', 'physician'])}, studied "
        f"{rng.choice(['desert soils', 'comet tails', 'medicinal plants', 'river sediments', 'sleep patterns'])} for "
        f"{rng.choice(_NUMBERS)} years. Working with very simple tools, the researcher discovered that "
        f"{rng.choice(['small changes in temperature matter more than expected', 'the samples followed a yearly cycle', 'two separate effects had been confused', 'an old measurement was wrong'])}. "
        f"At first, other scientists {rng.choice(['ignored the result', 'doubted the data', 'asked for more evidence', 'tried to repeat the work'])}; "
        f"today the finding is {rng.choice(['taught in many universities', 'used to plan new studies', 'part of standard textbooks', 'still debated'])}."
    )


def _expedition(rng: random.Random) -> str:
    return (
        f"In {rng.randint(1850, 2015)}, a team of {rng.choice(_NUMBERS)} {rng.choice(['climbers', 'sailors', 'students', 'surveyors'])} set out to cross the "
        f"{_name(rng)} {rng.choice(['mountains', 'glacier', 'desert', 'strait'])}. They carried {rng.choice(['food for a month', 'only light tents', 'old maps', 'a small radio'])}. "
        f"Halfway through, {rng.choice(['a storm destroyed their camp', 'one member fell ill', 'the ice began to crack', 'their guide left them'])}, "
        f"and they had to {rng.choice(['wait for nine days', 'change their route', 'split into two groups', 'turn back for supplies'])}. "
        f"In the end they {rng.choice(['reached the far side', 'returned safely', 'mapped a new valley', 'were rescued by fishermen'])}."
    )


def _dish(rng: random.Random) -> str:
    return (
        f"{_name(rng)} stew is a traditional dish from the {_name(rng)} valley. It is made from "
        f"{rng.choice(['beans', 'lamb', 'mushrooms', 'barley'])}, {rng.choice(['onions', 'carrots', 'chestnuts', 'plums'])} and "
        f"{rng.choice(['smoked pepper', 'fresh herbs', 'sour cream', 'dark bread'])}, cooked slowly for {rng.choice(_NUMBERS)} hours. "
        f"Families serve it during {rng.choice(['weddings', 'the first snow', 'harvest week', 'long winter evenings'])}. "
        f"Each village claims its own recipe is the original, and cooks rarely share {rng.choice(['their secret spice', 'the exact timing', 'how they prepare the pot'])}."
    )


def _workshop(rng: random.Random) -> str:
    return (
        f"{_name(rng)} Works started as a small {rng.choice(['repair shop', 'bakery', 'print shop', 'boat yard'])} run by "
        f"{_person(rng)}. Customers came back because {rng.choice(['the work was careful', 'prices stayed low', 'orders were always on time', 'the owner explained every step'])}. "
        f"Over {rng.choice(_NUMBERS)} decades it grew to employ {rng.randint(20, 400)} people. "
        f"Its biggest challenge now is {rng.choice(['finding trained workers', 'rising rent', 'competition from large factories', 'keeping old machines running'])}."
    )


_TEMPLATES: dict[str, Callable[[random.Random], str]] = {
    "town": _town,
    "invention": _invention,
    "animal": _animal,
    "scientist": _scientist,
    "expedition": _expedition,
    "dish": _dish,
    "workshop": _workshop,
}


def build_passages(num: int = NUM_PASSAGES, seed: int = SEED) -> list[dict[str, Any]]:
    """Deterministic task items: topics cycle through the templates."""
    rng = random.Random(seed)
    topics = list(_TEMPLATES)
    items = []
    for i in range(num):
        topic = topics[i % len(topics)]
        items.append({"id": f"writing-{i:04d}", "topic": topic, "passage": _TEMPLATES[topic](rng)})
    return items


def load_passages(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The shipped task items (or a user file with the same item format)."""
    with open(path or DATA_FILE, encoding="utf-8") as f:
        items = json.load(f)
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("passage"), str) or not item["passage"].strip():
            raise ValueError(f"writing task item {i} of {path or DATA_FILE} needs a non-empty 'passage' string")
    return items


def write_data_file(path: Path = DATA_FILE) -> None:
    path.write_text(json.dumps(build_passages(), indent=1, ensure_ascii=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_data_file()
    print(f"wrote {NUM_PASSAGES} passages to {DATA_FILE}")
