"""What request bodies share: unknown fields are refused, and free-form fields are checked where parsed."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict

from events.limits import check_labels, check_metadata


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Checked where the request is parsed, before any other work: a body too deep or too
# large for a command is refused here with the limit, never deeper in the service.
Metadata = Annotated[dict[str, Any], AfterValidator(check_metadata)]
Labels = Annotated[dict[str, str], AfterValidator(check_labels)]
