"""The time a question names, as a window of UTC time (pure).

"What did I buy last Saturday?", "in March and April", "four weeks ago", "on 1 February,
2023": history search reads the phrase against the time the question is asked (`now`) and
ranks what was said inside the window first (`projections.qdrant.ranking.timed`). It is a
prior, not a filter: a phrase read wrongly, or an event told days after it happened, costs
some rank, never the answer.

What is read (English, case-insensitive); several phrases make one window from the earliest
start to the latest end:
- a date: "1 February, 2023", "February 1st 2023", "2023-02-01", "May 3" (the latest before now);
- a month: "December 2023", or after in/during/since/early/mid/late/last/this/by/until: "in June",
  "in March and April" (the latest such month that has begun);
- a year: "in 2023", "during 2022", or a year standing alone;
- yesterday, the day before yesterday, last night, today, tonight, this morning, earlier today;
  last/this/earlier this week, month, year, weekend; over the weekend; last Monday..Sunday;
- "N days/weeks/months/years ago" (N in digits or words, "a", "a couple of", "a few"): that day
  give or take one, or the unit around the time N units back;
- "in the last/past (N) days/weeks/months/years": from N units back until now.

A phrase about the future ("next week", "tomorrow") names no window of the past and is left out.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import NamedTuple


class Window(NamedTuple):
    since: datetime  # inclusive
    until: datetime  # exclusive

    def ms(self) -> tuple[int, int]:
        return int(self.since.timestamp() * 1000), int(self.until.timestamp() * 1000)


MONTHS = {m: i + 1 for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november",
     "december"])}
MONTHS |= {m[:3]: i for m, i in list(MONTHS.items())} | {"sept": 9}
WEEKDAYS = {d: i for i, d in enumerate(["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"])}
NUMBERS = {w: i + 1 for i, w in enumerate(
    ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"])}
NUMBERS |= {"a": 1, "an": 1, "a couple of": 2, "couple of": 2, "a few": 3, "few": 3, "several": 3}
UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}

_MONTH = r"(" + "|".join(sorted(MONTHS, key=len, reverse=True)) + r")\.?"
_NUM = r"(\d{1,3}|" + "|".join(sorted(NUMBERS, key=len, reverse=True)) + r")"
_UNIT = r"(day|week|month|year)s?"
_ORD = r"(?:st|nd|rd|th)?"

PATTERNS: list[tuple[str, re.Pattern[str]]] = [(name, re.compile(p, re.I)) for name, p in [
    ("iso", r"\b(\d{4})-(\d{2})-(\d{2})\b"),
    ("day_month_year", rf"\b(\d{{1,2}}){_ORD}\s+(?:of\s+)?{_MONTH},?\s+(\d{{4}})\b"),
    ("month_day_year", rf"\b{_MONTH}\s+(\d{{1,2}}){_ORD},?\s+(\d{{4}})\b"),
    ("month_year", rf"\b{_MONTH},?\s+(\d{{4}})\b"),
    ("month_day", rf"\b{_MONTH}\s+(\d{{1,2}}){_ORD}\b(?!\s*(?:,\s*)?\d)"),
    ("day_month", rf"\b(\d{{1,2}}){_ORD}\s+(?:of\s+)?{_MONTH}\b(?!,?\s*\d)"),
    ("months", rf"\b(?:in|during|since|early|mid|late|last|this|by|until|through|of)\s+(?:-\s*)?{_MONTH}"
               rf"(?:\s*(?:and|or|to|through|-)\s*{_MONTH})?\b(?!\s*(?:,\s*)?\d)"),
    ("year", r"\b(?:in|during|of|since|by|until|through)\s+((?:19|20)\d{2})\b|\b((?:19|20)\d{2})\b"),
    ("ago", rf"\b{_NUM}\s+{_UNIT}\s+ago\b"),
    ("past", rf"\b(?:in|over|during|within|for)\s+the\s+(?:last|past)\s+(?:{_NUM}\s+)?{_UNIT}\b"),
    ("day_before", r"\bthe\s+day\s+before\s+yesterday\b"),
    ("last_weekday", r"\blast\s+(" + "|".join(WEEKDAYS) + r")\b"),
    ("relative", r"\b(last|this|earlier\s+this)\s+(week|weekend|month|year)\b"),
    ("over_weekend", r"\bover\s+the\s+weekend\b"),
    ("day_word", r"\b(yesterday|today|tonight|last\s+night|this\s+(?:morning|afternoon|evening)|earlier\s+today)\b"),
]]


def window(text: str, now: datetime) -> Window | None:
    """The window the question names, read against `now` (UTC); None when it names none."""
    found: list[Window] = []
    spans: list[tuple[int, int]] = []
    for name, pattern in PATTERNS:
        for m in pattern.finditer(text):
            if any(m.start() < b and a < m.end() for a, b in spans):
                continue  # part of a longer phrase already read ("1 February, 2023" is not also "2023")
            spans.append(m.span())  # read, even when it names no window ("31 February, 2023")
            if (w := _read(name, m, now)) is not None:
                found.append(w)
    if not found:
        return None
    return Window(min(w.since for w in found), max(w.until for w in found))


def _day(d: date) -> Window:
    start = datetime(d.year, d.month, d.day, tzinfo=UTC)
    return Window(start, start + timedelta(days=1))


def _month(year: int, month: int) -> Window:
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return Window(start, end)


def _latest_month(month: int, now: datetime) -> Window:
    """The latest `month` that has begun by `now`."""
    return _month(now.year if month <= now.month else now.year - 1, month)


def _latest_day(month: int, day: int, now: datetime) -> Window | None:
    for year in (now.year, now.year - 1):
        try:
            d = date(year, month, day)
        except ValueError:
            return None
        if d <= now.date():
            return _day(d)
    return None


def _number(s: str | None) -> int:
    return 1 if s is None else int(s) if s.isdigit() else NUMBERS[s.lower()]


def _read(name: str, m: re.Match[str], now: datetime) -> Window | None:
    g = [x.lower() if x else x for x in m.groups()]
    today = now.date()
    try:
        if name == "iso":
            return _day(date(int(g[0]), int(g[1]), int(g[2])))
        if name == "day_month_year":
            return _day(date(int(g[2]), MONTHS[g[1]], int(g[0])))
        if name == "month_day_year":
            return _day(date(int(g[2]), MONTHS[g[0]], int(g[1])))
    except ValueError:
        return None  # "31 February": no such day
    if name == "month_year":
        return _month(int(g[1]), MONTHS[g[0]])
    if name == "month_day":
        return _latest_day(MONTHS[g[0]], int(g[1]), now)
    if name == "day_month":
        return _latest_day(MONTHS[g[1]], int(g[0]), now)
    if name == "months":
        first = _latest_month(MONTHS[g[0]], now)
        if g[1] is None:
            return first
        last = _latest_month(MONTHS[g[1]], now)
        return Window(min(first.since, last.since), max(first.until, last.until))
    if name == "year":
        year = int(g[0] or g[1])
        return _month(year, 1)._replace(until=datetime(year + 1, 1, 1, tzinfo=UTC)) if year <= now.year else None
    if name == "ago":
        n, unit = _number(g[0]), g[1]
        if unit == "day":  # that day, give or take one
            day = _day(today - timedelta(days=n))
            return Window(day.since - timedelta(days=1), day.until + timedelta(days=1))
        centre = now - timedelta(days=n * UNIT_DAYS[unit])
        half = timedelta(days=UNIT_DAYS[unit] / 2)
        return Window(centre - half, centre + half)
    if name == "past":
        return Window(now - timedelta(days=_number(g[0]) * UNIT_DAYS[g[1]]), now)
    if name == "last_weekday":
        back = (today.weekday() - WEEKDAYS[g[0]]) % 7 or 7
        return _day(today - timedelta(days=back))
    if name == "relative":  # "earlier this week" is this week
        return _relative("this" if g[0].startswith("earlier") else g[0], g[1], today, now)
    if name == "over_weekend":
        return _relative("last", "weekend", today, now)
    if name == "day_before":
        return _day(today - timedelta(days=2))
    if g[0] == "yesterday" or g[0].startswith("last"):  # last night
        return _day(today - timedelta(days=1))
    return _day(today)


def _relative(which: str, unit: str, today: date, now: datetime) -> Window:
    monday = today - timedelta(days=today.weekday())
    if unit == "week":
        start = monday - timedelta(days=7) if which == "last" else monday
        return Window(_day(start).since, _day(start + timedelta(days=6)).until)
    if unit == "weekend":
        saturday = monday + timedelta(days=5)
        if which == "last" and saturday >= today:
            saturday -= timedelta(days=7)
        return Window(_day(saturday).since, _day(saturday + timedelta(days=1)).until)
    if unit == "month":
        if which == "this":
            return _month(today.year, today.month)
        return _month(today.year - (today.month == 1), (today.month - 2) % 12 + 1)
    return _month(today.year - (which == "last"), 1)._replace(
        until=datetime(today.year - (which == "last") + 1, 1, 1, tzinfo=UTC))
