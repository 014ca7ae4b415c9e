"""The scripted model's routing: the rule that lets modules share one server without taking
each other's answers."""

from tests.fakes.model_server import FakeModel


def ask(fake: FakeModel, text: str):
    return fake._next({"messages": [{"role": "user", "content": text}]})


def test_a_used_up_route_quoted_in_a_later_prompt_leaves_the_answer_to_the_route_with_answers_left():
    fake = FakeModel()
    fake.default = "default"
    first = fake.on("mk-one", "one")
    second = fake.on("mk-two", "two")
    assert ask(fake, "turn mk-one") == "one"
    # The later turn's prompt shows the first turn's fact (an existing memory) beside its own marker.
    assert ask(fake, "existing: mk-one; turn mk-two") == "two"
    assert (first.hits, second.hits) == (1, 1)
    # With no route holding answers, the first that matches answers with the default and counts it.
    assert ask(fake, "mk-one again") == "default"
    assert first.hits == 2


def test_a_route_until_used_steps_aside_once_its_answers_are_used():
    fake = FakeModel()
    fake.default = "default"
    wide = fake.on("schema", "wide", until_used=True)
    assert ask(fake, "schema") == "wide"
    assert ask(fake, "schema") == "default" and wide.hits == 1
