"""Staff-written reminder texts: placeholders are validated by the model and filled as plain text."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from workshops.models import Workshop, WorkshopText
from workshops.placeholders import PLACEHOLDERS, fill, text_problems
from workshops.services import workshop_update

pytestmark = pytest.mark.django_db


def _errors(excinfo) -> dict[str, str]:
    return {field: " ".join(messages) for field, messages in excinfo.value.message_dict.items()}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (
            "Hi {atendee_name}",
            ["Unknown placeholder {atendee_name}.", "Did you mean {attendee_name}?"],
        ),
        ("{workshop.title}", ["Unknown placeholder {workshop.title}."]),
        ("{settings}", ["Unknown placeholder {settings}."]),
        (
            "{ start_local }",
            ["Unknown placeholder { start_local }.", "Did you mean {start_local}?"],
        ),
        ("{attendee_name|upper}", ["Unknown placeholder {attendee_name|upper}."]),
        ("Costs {0}", ["Unknown placeholder {0}."]),
        ("Open { brace", ["A lone '{' at character 6"]),
        ("close } brace", ["A lone '}' at character 7"]),
        ("{{attendee_name}", ["A lone '}' at character 16"]),
    ],
)
def test_a_wrong_placeholder_is_a_model_error_naming_it_and_listing_the_valid_ones(
    make_workshop, text, named
):
    workshop = make_workshop(starts_in=timedelta(days=2))
    for field in ("reminder_subject", "reminder_intro"):
        setattr(workshop, field, text)
        with pytest.raises(ValidationError) as excinfo:
            workshop.full_clean()
        message = _errors(excinfo)[field]
        for part in named:
            assert part in message
        assert "Valid placeholders: " + ", ".join(f"{{{n}}}" for n in PLACEHOLDERS) in message
        setattr(workshop, field, "")


def test_every_mistake_in_one_text_is_named_at_once():
    problems = text_problems("{a} and {b} and {attendee_name} and }")
    assert [p.split(".")[0] for p in problems] == [
        "Unknown placeholder {a}",
        "Unknown placeholder {b}",
        "A lone '}' at character 37: write }} for a literal brace, or a placeholder such as {attendee_name}",
    ]


def test_valid_texts_pass_and_doubled_braces_are_literal(make_workshop):
    workshop = make_workshop(starts_in=timedelta(days=2))
    workshop.reminder_subject = "{workshop_title} at {start_local} {{not a placeholder}}"
    workshop.reminder_intro = "\n\n".join(f"{{{name}}}" for name in PLACEHOLDERS)
    workshop.full_clean()
    assert fill("{{x}} {attendee_name}", {"attendee_name": "Ana"}) == "{x} Ana"


def test_an_invalid_text_is_refused_by_the_service_and_nothing_is_saved(make_workshop):
    workshop = make_workshop(starts_in=timedelta(days=2), title="Kiln basics")
    with pytest.raises(ValidationError) as excinfo:
        workshop_update(workshop=workshop, reminder_intro="Dear {name}", title="Changed")
    assert "Unknown placeholder {name}." in _errors(excinfo)["reminder_intro"]
    workshop.refresh_from_db()
    assert (workshop.title, workshop.reminder_intro) == ("Kiln basics", "")


def test_filling_is_plain_substitution_that_never_reaches_an_object():
    values = {"attendee_name": "{workshop_title}", "workshop_title": "Kiln"}
    # A value is never filled again, and nothing else is looked up or called.
    assert fill("{attendee_name} / {workshop_title}", values) == "{workshop_title} / Kiln"
    assert fill("{__class__} {attendee_name.__class__}", values) == (
        "{__class__} {attendee_name.__class__}"
    )
    assert fill("{location}!", {"location": ""}) == "!"


def test_a_text_in_the_workshops_own_language_is_refused(make_workshop):
    workshop = make_workshop(starts_in=timedelta(days=2))
    assert workshop.language == "en"
    own = WorkshopText(workshop=workshop, language="en", reminder_subject="Hi")
    with pytest.raises(ValidationError) as excinfo:
        own.full_clean()
    assert "the workshop's own language" in _errors(excinfo)["language"]
    WorkshopText(
        workshop=workshop, language="de", reminder_subject="Hallo {workshop_title}"
    ).full_clean()
    bad = WorkshopText(workshop=workshop, language="fr", reminder_intro="Bonjour {nom}")
    with pytest.raises(ValidationError) as excinfo:
        bad.full_clean()
    assert "Unknown placeholder {nom}." in _errors(excinfo)["reminder_intro"]


def test_languages_are_those_of_settings(make_workshop):
    workshop = make_workshop(starts_in=timedelta(days=2))
    workshop.language = "es"
    with pytest.raises(ValidationError) as excinfo:
        workshop.full_clean()
    assert "language" in excinfo.value.message_dict
    assert {code for code, _ in Workshop._meta.get_field("language").choices} >= {"en", "de", "fr"}
