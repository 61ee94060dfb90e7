"""Staff side of the API: integrations, their tokens (made once, revoked, never edited) and the
writes each token made."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.template.response import TemplateResponse

from intake.models import ApiToken, ApiWrite, Integration
from intake.tokens import SCOPES, token_create, token_revoke


class TokenForm(forms.ModelForm):
    integration_name = forms.CharField(
        label="Integration",
        max_length=100,
        help_text="The outside system it is for, e.g. 'shop' (created if new). Its ids for "
        "workshops and attendees are its own.",
    )
    scopes = forms.MultipleChoiceField(
        choices=ApiToken.Scope.choices,
        widget=forms.CheckboxSelectMultiple,
        initial=["read", "enrolments"],
        help_text="What it may do. A token cannot be changed: make a new one and revoke this.",
    )

    class Meta:
        model = ApiToken
        fields = ("name",)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "scope_list",
        "created_at",
        "created_by",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("integration", ("revoked_at", admin.EmptyFieldListFilter))
    actions = ["revoke_selected"]
    readonly_fields = (
        "integration", "name", "prefix", "scope_list", "created_at", "created_by",
        "last_used_at", "revoked_at", "revoked_by",
    )  # fmt: skip

    @admin.display(description="Scopes")
    def scope_list(self, obj: ApiToken) -> str:
        return ", ".join(obj.scopes)

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = TokenForm
            kwargs["fields"] = ("integration_name", "name", "scopes")
        return super().get_form(request, obj, **kwargs)

    def get_fields(self, request, obj=None):
        return ("integration_name", "name", "scopes") if obj is None else self.readonly_fields

    def get_readonly_fields(self, request, obj=None):
        return () if obj is None else self.readonly_fields

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # revoked, not deleted: its writes stay attributed

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def save_model(self, request, obj, form, change) -> None:
        made = token_create(
            integration=form.cleaned_data["integration_name"],
            name=form.cleaned_data["name"],
            scopes=[s for s in SCOPES if s in form.cleaned_data["scopes"]],
            created_by=request.user.get_username(),
        )
        for field in ApiToken._meta.concrete_fields:
            setattr(obj, field.attname, getattr(made.token, field.attname))
        obj._state.adding = False
        request.api_token_made = made  # per request: the admin instance is shared

    def response_add(self, request, obj, post_url_continue=None):
        made = request.api_token_made
        return TemplateResponse(
            request,
            "admin/intake/token_created.html",
            {
                **self.admin_site.each_context(request),
                "title": "API token created",
                "token": made.token,
                "secret": made.secret,
                "opts": self.model._meta,
            },
        )

    def has_revoke_permission(self, request) -> bool:
        return request.user.has_perm("intake.revoke_apitoken")

    @admin.action(description="Revoke selected API tokens", permissions=["revoke"])
    def revoke_selected(self, request, queryset) -> None:
        done = sum(
            token_revoke(token=token, revoked_by=request.user.get_username()) for token in queryset
        )
        self.message_user(
            request,
            f"Revoked {done} token(s); requests with them now get 401.",
            messages.SUCCESS,
        )


@admin.register(Integration)
class IntegrationAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at")
    search_fields = ("name",)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ApiWrite)
class ApiWriteAdmin(admin.ModelAdmin):
    list_display = ("created_at", "token_label", "method", "path", "status")
    list_filter = ("token__integration", "method")
    readonly_fields = ("token", "token_label", "created_at", "method", "path", "status", "summary")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
