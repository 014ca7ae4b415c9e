"""The HTTP API: an app factory (`build_app`), one router per resource, one auth dependency."""

from services.http.app import build_app

__all__ = ["build_app"]
