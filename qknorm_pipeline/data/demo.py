"""A seeded synthetic translation task for the offline demo (`bash scripts/reproduce.sh`).

Source: English-like raw sentences, SVO, adjectives before the noun ("The two big red dogs saw
a cat near the old house.").  Target: an invented language that differs in ways a translation
model has to learn, not copy:
  * word order: subject - object - prepositional phrase - verb (SOV), adjectives after the
    noun in reverse order, the object followed by the case particle "ka";
  * agreement: determiners and adjectives take the noun's gender (fixed per noun, invisible in
    the source) and number; the noun takes a plural ending; the verb ending encodes tense and
    the subject's number ("saw" -> stem + "ib" singular / "ibon" plural);
  * a lexicon: every source word maps to an invented stem.
The sentences are generated at run time, deterministically from the seed, and train, dev and
test share no sentence.

Command line (used by scripts/download.sh):
    python -m qknorm_pipeline.data.demo --out DIR [--seed 1] [--train 4000 --dev 300 --test 300]
writes DIR/{train,dev,test}.{src,tgt}.
"""
import os
import random
import sys

from ..cli import Parser
from ..files import write_lines

# source noun -> (target stem, gender); plural source forms are regular (+s) except these
NOUNS = {
    "dog": ("kan", "m"), "cat": ("gat", "f"), "bird": ("vol", "m"), "horse": ("kaval", "m"),
    "child": ("nin", "m"), "woman": ("don", "f"), "man": ("om", "m"), "teacher": ("magistr", "f"),
    "farmer": ("agrikol", "m"), "king": ("rej", "m"), "queen": ("regin", "f"), "fish": ("pisk", "m"),
    "house": ("kaz", "f"), "tree": ("arbr", "m"), "river": ("flum", "m"), "book": ("libr", "m"),
    "table": ("mens", "f"), "garden": ("hort", "m"), "city": ("urb", "f"), "boat": ("nav", "f"),
}
IRREGULAR_PLURALS = {"child": "children", "woman": "women", "man": "men", "fish": "fish", "city": "cities"}
ADJECTIVES = {
    "big": "grand", "small": "pik", "red": "rub", "green": "verd", "old": "vek", "young": "jun",
    "happy": "fel", "sad": "trist", "black": "nigr", "white": "alb", "quiet": "kiet", "fast": "rapid",
}
# source verb -> (target stem, present 3sg, past)
VERBS = {
    "see": ("vid", "sees", "saw"), "find": ("trov", "finds", "found"), "love": ("am", "loves", "loved"),
    "follow": ("sekv", "follows", "followed"), "watch": ("spekt", "watches", "watched"),
    "help": ("help", "helps", "helped"), "draw": ("desegn", "draws", "drew"),
    "carry": ("port", "carries", "carried"), "know": ("kon", "knows", "knew"),
    "visit": ("vizit", "visits", "visited"),
}
PREPOSITIONS = {"near": "apud", "behind": "post", "under": "sub", "with": "kun"}
# verb endings: (tense, plural subject) -> suffix
VERB_ENDINGS = {("present", False): "at", ("present", True): "ant", ("past", False): "ib",
                ("past", True): "ibon", ("future", False): "ero", ("future", True): "eron"}
# determiner kinds: source word (singular, plural), target word by (gender, plural)
DETERMINERS = {
    "def": (("the", "the"), {("m", False): "il", ("f", False): "la", ("m", True): "ili", ("f", True): "le"}),
    "indef": (("a", "some"), {("m", False): "un", ("f", False): "una", ("m", True): "kelki", ("f", True): "kelke"}),
    "two": ((None, "two"), {("m", True): "du", ("f", True): "dua"}),
    "three": ((None, "three"), {("m", True): "tri", ("f", True): "tria"}),
}
NOUN_ENDING = {("m", False): "o", ("f", False): "a", ("m", True): "oj", ("f", True): "aj"}
ADJ_ENDING = {("m", False): "e", ("f", False): "a", ("m", True): "ej", ("f", True): "aj"}


def _noun_phrase(rng):
    noun = rng.choice(sorted(NOUNS))
    det = rng.choice(sorted(DETERMINERS))
    plural = det in ("two", "three") or (rng.random() < 0.4)
    adjs = rng.sample(sorted(ADJECTIVES), rng.choice([0, 0, 1, 1, 2]))
    stem, gender = NOUNS[noun]
    src_det = DETERMINERS[det][0][plural]
    src_noun = (IRREGULAR_PLURALS.get(noun, noun + "s")) if plural else noun
    src = [src_det] + adjs + [src_noun]
    key = (gender, plural)
    tgt = [DETERMINERS[det][1][key], stem + NOUN_ENDING[key]]
    tgt += [ADJECTIVES[a] + ADJ_ENDING[key] for a in reversed(adjs)]
    return src, tgt, plural


def make_pair(rng):
    """One (source, target) sentence pair; the source is raw text, the target tokenized."""
    subj, subj_t, subj_plural = _noun_phrase(rng)
    obj, obj_t, _ = _noun_phrase(rng)
    verb = rng.choice(sorted(VERBS))
    stem, third_sg, past = VERBS[verb]
    tense = rng.choice(["present", "past", "future"])
    if tense == "present":
        src_verb = [verb if subj_plural else third_sg]
    elif tense == "past":
        src_verb = [past]
    else:
        src_verb = ["will", verb]
    src = subj + src_verb + obj
    tgt = subj_t + obj_t + ["ka"]
    if rng.random() < 0.35:
        prep = rng.choice(sorted(PREPOSITIONS))
        pp, pp_t, _ = _noun_phrase(rng)
        src += [prep] + pp
        tgt += [PREPOSITIONS[prep]] + pp_t
    tgt.append(stem + VERB_ENDINGS[(tense, subj_plural)])
    text = " ".join(src)
    return text[0].upper() + text[1:] + ".", " ".join(tgt) + " ."


def generate(seed=1, sizes=(("train", 4000), ("dev", 300), ("test", 300))):
    """{split: [(src, tgt), ...]} with no source sentence shared between or within splits."""
    rng = random.Random(seed)
    seen = set()
    out = {}
    for split, n in sizes:
        pairs = []
        while len(pairs) < n:
            src, tgt = make_pair(rng)
            if src not in seen:
                seen.add(src)
                pairs.append((src, tgt))
        out[split] = pairs
    return out


def write(out_dir, seed=1, train=4000, dev=300, test=300):
    os.makedirs(out_dir, exist_ok=True)
    data = generate(seed, (("train", train), ("dev", dev), ("test", test)))
    for split, pairs in data.items():
        for side, lang in ((0, "src"), (1, "tgt")):
            write_lines(os.path.join(out_dir, f"{split}.{lang}"), [p[side] for p in pairs])
    return data


def main(argv=None):
    p = Parser(prog="python -m qknorm_pipeline.data.demo", description=__doc__)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train", type=int, default=4000)
    p.add_argument("--dev", type=int, default=300)
    p.add_argument("--test", type=int, default=300)
    a = p.parse_args(argv)
    for name in ("train", "dev", "test"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    write(a.out, a.seed, a.train, a.dev, a.test)
    print(f"demo corpus (seed {a.seed}): {a.train} / {a.dev} / {a.test} pairs in {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
