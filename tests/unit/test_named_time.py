"""The time a question names, read against when it is asked (events.rules.named_time)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from events.rules.named_time import window

SATURDAY = datetime(2023, 4, 22, 8, 1, tzinfo=UTC)


def days(text: str, now: datetime = SATURDAY) -> tuple[date, date] | None:
    """The window as (first day, the day after the last)."""
    w = window(text, now)
    return None if w is None else (w.since.date(), w.until.date())


@pytest.mark.parametrize(("text", "expected"), [
    ("What did Gina find for her store on 1 February, 2023?", (date(2023, 2, 1), date(2023, 2, 2))),
    ("What was she accepted for on May 23, 2023?", (date(2023, 5, 23), date(2023, 5, 24))),
    ("the 3rd of March 2022", (date(2022, 3, 3), date(2022, 3, 4))),
    ("what happened on 2023-01-31", (date(2023, 1, 31), date(2023, 2, 1))),
    ("What class did Maria start in December 2023?", (date(2023, 12, 1), date(2024, 1, 1))),
    ("How often has she gone to the beach in 2023?", (date(2023, 1, 1), date(2024, 1, 1))),
])
def test_a_date_month_or_year_it_spells_out(text, expected):
    assert days(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    # The latest such month that has begun: April is this one, June last year's.
    ("Which airline did I fly with the most in March and April?", (date(2023, 3, 1), date(2023, 5, 1))),
    ("When did Melanie go camping in June?", (date(2022, 6, 1), date(2022, 7, 1))),
    ("What did we say on April 30?", (date(2022, 4, 30), date(2022, 5, 1))),
    ("Who did I go with to the music event last Saturday?", (date(2023, 4, 15), date(2023, 4, 16))),
    ("What did I cook yesterday?", (date(2023, 4, 21), date(2023, 4, 22))),
    ("what did we watch last night", (date(2023, 4, 21), date(2023, 4, 22))),
    ("the day before yesterday", (date(2023, 4, 20), date(2023, 4, 21))),
    ("what you said this morning", (date(2023, 4, 22), date(2023, 4, 23))),
    ("the plan from earlier this week", (date(2023, 4, 17), date(2023, 4, 24))),
    ("what did I do over the weekend", (date(2023, 4, 15), date(2023, 4, 17))),
    ("a few days ago", (date(2023, 4, 18), date(2023, 4, 21))),
    ("What did we plan today?", (date(2023, 4, 22), date(2023, 4, 23))),
    ("what did I do last week", (date(2023, 4, 10), date(2023, 4, 17))),
    ("and last weekend?", (date(2023, 4, 15), date(2023, 4, 17))),
    ("what did I read last month", (date(2023, 3, 1), date(2023, 4, 1))),
    ("my trips this year", (date(2023, 1, 1), date(2024, 1, 1))),
    ("my trips last year", (date(2022, 1, 1), date(2023, 1, 1))),
    # N units back: that day give or take one, or the unit around it.
    ("the milestone I mentioned four weeks ago", (date(2023, 3, 21), date(2023, 3, 28))),
    ("the call 3 days ago", (date(2023, 4, 18), date(2023, 4, 21))),
    ("How much jewelry did I buy in the last two months?", (date(2023, 2, 21), date(2023, 4, 22))),
    ("over the past week", (date(2023, 4, 15), date(2023, 4, 22))),
    ("in the last few days", (date(2023, 4, 19), date(2023, 4, 22))),
])
def test_a_time_read_against_when_the_question_is_asked(text, expected):
    assert days(text) == expected


def test_several_phrases_make_one_window_from_the_first_start_to_the_last_end():
    assert days("between 1 February, 2023 and 3 March, 2023") == (date(2023, 2, 1), date(2023, 3, 4))


@pytest.mark.parametrize("text", [
    "May I ask what you recommended?",  # a month name that is a verb
    "How many weeks ago did I meet my aunt?",  # asks for a time, names none
    "What should I cook next week?",  # the future
    "my order 12345 from the shop",  # a number that is no year
    "on 31 February, 2023",  # no such day
    "in 2099",  # a year to come
    "",
])
def test_no_window_where_it_names_no_time_of_the_past(text):
    assert window(text, SATURDAY) is None


def test_a_window_in_unix_ms():
    w = window("yesterday", SATURDAY)
    assert w is not None and w.ms() == (1681948800000 + 86_400_000, 1681948800000 + 2 * 86_400_000)
