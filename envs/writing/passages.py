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


# Each template draws its words in reading order, so the passages (and tasks.json) stay byte-identical.
def _town(rng: random.Random) -> str:
    name, size, river = _name(rng), rng.choice(["small", "quiet", "busy", "hillside", "coastal"]), _name(rng)
    craft = rng.choice(["woven baskets", "blue pottery", "smoked cheese", "glass lanterns", "wool blankets"])
    generations = rng.choice(_NUMBERS)
    season = rng.choice(["spring", "summer", "autumn", "winter"])
    pastime = rng.choice(["watch boat races", "taste the harvest", "learn old songs", "trade handmade goods"])
    change = rng.choice(
        [
            "a new bridge has brought more tourists",
            "young people have moved to the city",
            "a railway station reopened",
            "floods have damaged the old market",
        ]
    )
    return (
        f"{name} is a {size} town on the banks of the {river} river. It is known for its {craft}, "
        f"which local families have made for {generations} generations. Every {season}, the town holds a "
        f"festival where visitors {pastime}. In recent years, {change}."
    )


def _invention(rng: random.Random) -> str:
    device = rng.choice(["water clock", "folding bicycle", "solar kettle", "wind pump", "paper press", "signal lamp"])
    inventor, year = _person(rng), rng.randint(1780, 1990)
    purpose = rng.choice(
        [
            "save fuel in remote villages",
            "help farmers water their fields",
            "send messages across valleys",
            "make printing cheaper",
        ]
    )
    flaw = rng.choice(
        ["heavy and hard to repair", "expensive to build", "unreliable in cold weather", "slow and noisy"]
    )
    improvement = rng.choice(
        ["used lighter metals", "were sold as simple kits", "worked in any season", "ran twice as fast"]
    )
    place = rng.choice(["schools", "small workshops", "mountain huts", "museums"])
    return (
        f"The {device} was first built by {inventor} in {year}. It was designed to {purpose}. "
        f"Early versions were {flaw}, but later models {improvement}. "
        f"Today the {device} is used mainly in {place}."
    )


def _animal(rng: random.Random) -> str:
    animal = f"{_name(rng).lower()} {rng.choice(['beetle', 'heron', 'lizard', 'fox', 'frog', 'owl'])}"
    habitat = rng.choice(["dry grasslands", "mangrove swamps", "high pine forests", "rocky islands"])
    food = rng.choice(["seeds and berries", "small fish", "insects", "roots and leaves"])
    active = rng.choice(["at dawn", "at night", "after rain", "in the hottest hours"])
    trait = rng.choice(
        [
            "a call that sounds like a bell",
            "the ability to change colour",
            "a nest built from mud and feathers",
            "a memory for hundreds of hiding places",
        ]
    )
    threat = rng.choice(["new roads", "warmer summers", "farming", "invasive rats"])
    trend = rng.choice(["fallen by half", "slowly declined", "recovered recently", "become hard to measure"])
    return (
        f"The {animal} lives in {habitat}. It feeds mostly on {food} and is most active {active}. "
        f"Its most unusual trait is {trait}. Because of {threat}, its numbers have {trend}."
    )


def _scientist(rng: random.Random) -> str:
    person = _person(rng)
    field = rng.choice(["chemist", "geologist", "botanist", "astronomer", "physician"])
    subject = rng.choice(["desert soils", "comet tails", "medicinal plants", "river sediments", "sleep patterns"])
    years = rng.choice(_NUMBERS)
    discovery = rng.choice(
        [
            "small changes in temperature matter more than expected",
            "the samples followed a yearly cycle",
            "two separate effects had been confused",
            "an old measurement was wrong",
        ]
    )
    reaction = rng.choice(
        ["ignored the result", "doubted the data", "asked for more evidence", "tried to repeat the work"]
    )
    legacy = rng.choice(
        ["taught in many universities", "used to plan new studies", "part of standard textbooks", "still debated"]
    )
    return (
        f"{person}, a {field}, studied {subject} for {years} years. Working with very simple tools, the "
        f"researcher discovered that {discovery}. At first, other scientists {reaction}; "
        f"today the finding is {legacy}."
    )


def _expedition(rng: random.Random) -> str:
    year, size = rng.randint(1850, 2015), rng.choice(_NUMBERS)
    crew = rng.choice(["climbers", "sailors", "students", "surveyors"])
    place = f"{_name(rng)} {rng.choice(['mountains', 'glacier', 'desert', 'strait'])}"
    supplies = rng.choice(["food for a month", "only light tents", "old maps", "a small radio"])
    setback = rng.choice(
        ["a storm destroyed their camp", "one member fell ill", "the ice began to crack", "their guide left them"]
    )
    response = rng.choice(
        ["wait for nine days", "change their route", "split into two groups", "turn back for supplies"]
    )
    outcome = rng.choice(
        ["reached the far side", "returned safely", "mapped a new valley", "were rescued by fishermen"]
    )
    return (
        f"In {year}, a team of {size} {crew} set out to cross the {place}. They carried {supplies}. "
        f"Halfway through, {setback}, and they had to {response}. In the end they {outcome}."
    )


def _dish(rng: random.Random) -> str:
    dish, valley = _name(rng), _name(rng)
    base = rng.choice(["beans", "lamb", "mushrooms", "barley"])
    vegetable = rng.choice(["onions", "carrots", "chestnuts", "plums"])
    topping = rng.choice(["smoked pepper", "fresh herbs", "sour cream", "dark bread"])
    hours = rng.choice(_NUMBERS)
    occasion = rng.choice(["weddings", "the first snow", "harvest week", "long winter evenings"])
    secret = rng.choice(["their secret spice", "the exact timing", "how they prepare the pot"])
    return (
        f"{dish} stew is a traditional dish from the {valley} valley. It is made from {base}, {vegetable} and "
        f"{topping}, cooked slowly for {hours} hours. Families serve it during {occasion}. "
        f"Each village claims its own recipe is the original, and cooks rarely share {secret}."
    )


def _workshop(rng: random.Random) -> str:
    name = _name(rng)
    trade = rng.choice(["repair shop", "bakery", "print shop", "boat yard"])
    founder = _person(rng)
    reason = rng.choice(
        [
            "the work was careful",
            "prices stayed low",
            "orders were always on time",
            "the owner explained every step",
        ]
    )
    decades, staff = rng.choice(_NUMBERS), rng.randint(20, 400)
    challenge = rng.choice(
        ["finding trained workers", "rising rent", "competition from large factories", "keeping old machines running"]
    )
    return (
        f"{name} Works started as a small {trade} run by {founder}. Customers came back because {reason}. "
        f"Over {decades} decades it grew to employ {staff} people. Its biggest challenge now is {challenge}."
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
