"""The admin, and a login for the headless browser (tests only: it logs in whoever is
named, so no real project has such a view)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model, login
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import path


def browser_login(request: HttpRequest) -> HttpResponse:
    user = get_user_model().objects.get(username=request.GET["user"])
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return HttpResponseRedirect(request.GET.get("next", "/admin/"))


urlpatterns = [
    path("admin/", admin.site.urls),
    path("browser-login/", browser_login),
]
