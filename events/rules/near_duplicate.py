"""Near-duplicate writes: a direct write that restates a live record of the same
agent, scope and kind, recently and in other words, is merged into it instead of stored twice.

Two measures decide: the embedding similarity of the texts, and the overlap of their content
words (Jaccard), which also keeps a write that adds a fact from vanishing into a shorter record.
Neither sees what turns a fact around while leaving the sentence almost as it was, so vetoes
come first, on the words alone: a number that differs ("4471" / "4472", "two" / "three"), a
negation on one side only ("run" / "never run"), a word swapped for another that is not a form
of it ("sister" / "brother", "Lisbon" / "Porto", "over" / "under"), and a text about something
of someone's the other never names ("the user's wife"). A sentence embedder scores such a
pair as high as a paraphrase (up to 0.99 with MiniLM), so the veto holds whatever the score; a
synonym swap outside the small `SYNONYMS` table ("takes the train" / "commutes by train") is
then not merged either, which costs a second record, where a wrong merge would lose a fact.

The thresholds were chosen on the labelled pairs of tests/data/near_duplicates.jsonl with the
local MiniLM embedder (docs/features/near-duplicate-merge.md). A served embedder has its own similarity
scale: `SIMILARITY_MIN` is what to re-tune for it.

The API measures the similarity (it has the embedder and the index) and puts the evidence on
the command; the ledger checks again what it can from its own state and the two texts, so the
decision and its inputs are in the log and a replay decides the same.
"""

from __future__ import annotations

import re
from datetime import timedelta

from events.commands import MergeEvidence

# A restatement this long after the survivor's last change is a new write, not a merge: an old
# fact restated much later is worth a record of its own time (observed_at, valid_from).
MERGE_WINDOW = timedelta(days=30)
# Cosine similarity of the two texts' vectors (local MiniLM) at or above which they may be one fact.
SIMILARITY_MIN = 0.82
# Jaccard overlap of content words at or above which they may be one fact: below it, one text
# says much the other does not, and merging would drop it.
OVERLAP_MIN = 0.5
# How many nearest records of the same scope and kind the API compares a write with.
CANDIDATES = 5
# Two words this long that start alike for this many letters are forms of one word
# ("allergic" / "allergy", "protected" / "protection").
SAME_STEM_PREFIX = 5

# Words one fact is stated with interchangeably: a swap within a group is a rewording, not
# another fact. Written from general usage (docs/features/near-duplicate-merge.md says what this means
# for the measured recall); a word in no group swapped for another is a veto.
SYNONYMS = (
    ("like", "enjoy", "love", "prefer", "favor", "want", "fond"),
    ("dislike", "hate", "detest", "avoid"),
    ("call", "name", "known"),
    ("keep", "store", "retain", "hold", "save", "kept"),
    ("run", "host", "hosted"),
    ("live", "reside", "stay", "based"),
    ("leave", "depart"),
    ("need", "require", "must"),
    ("reply", "answer", "respond"),
    ("start", "begin", "began"),
    ("finish", "end", "complete"),
    ("use", "utilize", "employ"),
    ("own", "possess"),
    ("speak", "talk"),
    ("buy", "purchase", "bought"),
    ("short", "brief", "concise"),
    ("big", "large", "huge"),
    ("small", "little", "tiny"),
    ("fast", "quick", "rapid"),
)

NEGATIONS = frozenset({
    "not", "no", "never", "none", "nothing", "nobody", "neither", "nor", "without", "cannot", "cant", "dont",
    "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "wont", "shouldnt", "mustnt", "neednt", "hasnt",
    "havent", "hadnt", "couldnt", "wouldnt",
})
STOPWORDS = frozenset({
    "a", "an", "the", "and", "or", "but", "of", "to", "in", "on", "at", "for", "by", "with", "from", "as", "into",
    "is", "are", "was", "were", "be", "been", "being", "am", "do", "does", "did", "has", "have", "had", "this",
    "that", "these", "those", "it", "its", "their", "they", "them", "his", "her", "he", "she", "s", "there",
    "which", "who", "whom", "what", "currently", "really", "also", "very", "just", "each", "every", "any", "all",
    "so", "then", "than", "about", "up", "out", "via", "if", "will", "would", "should", "shall",
})
NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "twenty": "20", "thirty": "30",
    "hundred": "100", "thousand": "1000",
}
_WORD = re.compile(r"[a-z0-9]+(?:[.,:][0-9]+)*")
# A number, alone or with a unit glued on ("7am", "30s", "5k"); "1password" or "eu-west-1" are names.
_NUMBER = re.compile(r"([0-9]+(?:[.,:][0-9]+)*)(?:am|pm|st|nd|rd|th|s|k|m|h|d|x|%)?")


def words(text: str) -> list[str]:
    """The text's words, lower case: apostrophes dropped ("don't" is "dont", "user's" is "user s"),
    hyphens joined ("wi-fi" is "wifi"), thousands separators out of numbers, number words as digits."""
    t = text.lower().replace("\u2019", "'").replace("n't", "nt").replace("'", " ")
    t = re.sub(r"(?<=\w)-(?=\w)", "", t)
    out = []
    for w in _WORD.findall(t):
        w = NUMBER_WORDS.get(w, w)
        if re.fullmatch(r"[0-9]{1,3}(,[0-9]{3})+", w):
            w = w.replace(",", "")
        out.append(w)
    return out


def stem(w: str) -> str:
    """A light suffix strip, so "prefers" / "prefer", "moving" / "moves" and "deployments" /
    "deploy" are one word, and British spelling as American ("colour"). Names with digits stay."""
    if any(c.isdigit() for c in w) or len(w) <= 3:
        return w
    if len(w) > 4:
        w = w.replace("our", "or")
    for suffix, keep in (("ies", "y"), ("ing", ""), ("ed", ""), ("ments", ""), ("ment", ""), ("ions", ""),
                         ("ion", ""), ("es", "e"), ("s", "")):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and not (suffix == "s" and w.endswith("ss")):
            w = w[: len(w) - len(suffix)] + keep
            break
    return w[:-1] if w.endswith("e") and len(w) > 3 else w


def content_words(text: str) -> frozenset[str]:
    """What `word_overlap` compares: the words that are not stopwords, stemmed. Negation words
    are left to `negated`, so "doesn't" and "does not" are the same."""
    return frozenset(stem(w) for w in words(text) if w not in STOPWORDS and w not in NEGATIONS)


def numbers(text: str) -> frozenset[str]:
    """The numbers a text states, without their unit letters ("7am" is 7), number words as digits."""
    return frozenset(m.group(1) for w in words(text) if (m := _NUMBER.fullmatch(w)))


def negated(text: str) -> bool:
    """Whether the text negates: an odd number of negation words ("not", "never", "don't" ...)."""
    return sum(w in NEGATIONS for w in words(text)) % 2 == 1


def word_overlap(a: str, b: str) -> float:
    """Jaccard overlap of the two texts' content words, 0 to 1; two texts without any are equal (1)."""
    wa, wb = content_words(a), content_words(b)
    if not wa and not wb:
        return 1.0
    return len(wa & wb) / len(wa | wb)


def _groups() -> dict[str, int]:
    return {stem(w): i for i, group in enumerate(SYNONYMS) for w in group}


def _forms(x: str, y: str) -> bool:
    """Whether two (stemmed) words say the same: one `SYNONYMS` group, or forms of one word
    (alphabetic and alike for `SAME_STEM_PREFIX` letters)."""
    if (g := _SYNONYM_OF.get(x)) is not None and g == _SYNONYM_OF.get(y):
        return True
    if not (x.isalpha() and y.isalpha()):
        return False
    n = SAME_STEM_PREFIX
    return len(x) >= n and len(y) >= n and x[:n] == y[:n]


_SYNONYM_OF = _groups()


def swapped(a: str, b: str) -> bool:
    """Whether each text has a content word the other lacks that is no form of any of the other's:
    a word swapped for another, not one added."""
    wa, wb = content_words(a), content_words(b)
    only_a, only_b = wa - wb, wb - wa
    rest_a = {x for x in only_a if not any(_forms(x, y) for y in only_b)}
    rest_b = {y for y in only_b if not any(_forms(x, y) for x in only_a)}
    return bool(rest_a) and bool(rest_b)


def possessed(text: str) -> frozenset[str]:
    """What the text says someone has ("the user's sister": "sister"), stemmed."""
    ws = words(text)
    found = set()
    for i, w in enumerate(ws[:-1]):
        if w == "s" and i > 0:
            following = next((x for x in ws[i + 1:] if x not in STOPWORDS), None)
            if following is not None:
                found.add(stem(following))
    return frozenset(found)


def new_owner(a: str, b: str) -> bool:
    """Whether one text is about something of another's the other never names: "the user works
    as a nurse" / "the user's wife works as a nurse" differ in whom the fact is about, though
    one only adds a word."""
    return bool(possessed(a) - content_words(b)) or bool(possessed(b) - content_words(a))


def veto(a: str, b: str) -> str | None:
    """Why two texts are never one fact however alike they embed: "numbers", "negation", "swap",
    "owner", or None."""
    if numbers(a) != numbers(b):
        return "numbers"
    if negated(a) != negated(b):
        return "negation"
    if swapped(a, b):
        return "swap"
    if new_owner(a, b):
        return "owner"
    return None


def is_near_duplicate(similarity: float, overlap: float, age: timedelta) -> bool:
    """The rule on measured inputs (the vetoes apart): within the window, embedded alike, and
    sharing most content words."""
    if age < timedelta(0) or age > MERGE_WINDOW:
        return False
    return similarity >= SIMILARITY_MIN and overlap >= OVERLAP_MIN


def decide(a: str, b: str, similarity: float, age: timedelta) -> bool:
    """The whole rule on two texts: no veto, and `is_near_duplicate` on their overlap."""
    return veto(a, b) is None and is_near_duplicate(similarity, word_overlap(a, b), age)


def evidence(record_id: str, a: str, b: str, similarity: float, age: timedelta) -> MergeEvidence | None:
    """The evidence a merge carries if `a` (the write) restates `b` (the live record `record_id`)."""
    if not decide(a, b, similarity, age):
        return None
    return MergeEvidence(record_id=record_id, similarity=round(similarity, 6), overlap=round(word_overlap(a, b), 6),
                         age_s=max(0.0, age.total_seconds()))
