"""Staff side of the API: integrations, their tokens (made once, revoked, never edited) and the
writes each token made."""

from __future__ import annotations

import re
import uuid

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from clock import default_clock
from intake import csvfile
from intake.imports import ImportForm, export_rows, import_preview
from intake.models import ApiToken, ApiWrite, CsvTransfer, Integration
from intake.services import EnrolmentIn, Refused, enrolments_upsert
from intake.tokens import token_create, token_revoke
from reminders.admin.columns import NulFreeListMixin, plural, utc_column
from workshops.models import Workshop


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
class ApiTokenAdmin(NulFreeListMixin, admin.ModelAdmin):
    list_display = (
        "__str__",
        "scope_list",
        "created_at_utc",
        "created_by",
        "last_used_at_utc",
        "revoked_at_utc",
    )
    list_filter = ("integration", ("revoked_at", admin.EmptyFieldListFilter))
    list_select_related = ("integration",)  # each row's name shows its integration
    actions = ["revoke_selected"]
    readonly_fields = (
        "integration", "name", "prefix", "scope_list", "created_at_utc", "created_by",
        "last_used_at_utc", "revoked_at_utc", "revoked_by",
    )  # fmt: skip
    created_at_utc = utc_column("created_at", "Created")
    last_used_at_utc = utc_column("last_used_at", "Last used")
    revoked_at_utc = utc_column("revoked_at", "Revoked")

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

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # made once, never edited: make a new one and revoke this

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def save_model(self, request, obj, form, change) -> None:
        made = token_create(
            integration=form.cleaned_data["integration_name"],
            name=form.cleaned_data["name"],
            scopes=form.cleaned_data["scopes"],
            created_by=request.user.get_username(),
        )
        for field in ApiToken._meta.concrete_fields:
            setattr(obj, field.attname, getattr(made.token, field.attname))
        obj._state.adding = False
        request.api_token_made = made  # per request: the admin instance is shared

    def response_add(self, request, obj, post_url_continue=None):
        made = request.api_token_made
        response = TemplateResponse(
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
        response["Cache-Control"] = "no-store"  # the token is on this page, once
        return response

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
class IntegrationAdmin(NulFreeListMixin, admin.ModelAdmin):
    list_display = ("name", "created_at_utc")
    search_fields = ("name",)
    created_at_utc = utc_column("created_at", "Created")

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_readonly_fields(self, request, obj=None):
        # Found by it (the CSV import's form, the tokens): renamed, its ids would split.
        return ("name",) if obj is not None else ()


@admin.register(ApiWrite)
class ApiWriteAdmin(NulFreeListMixin, admin.ModelAdmin):
    list_display = ("created_at_utc", "token_label", "method", "path", "status")
    list_filter = ("token__integration", "method")
    readonly_fields = (
        "token", "token_label", "created_at_utc", "method", "path", "status", "summary",
    )  # fmt: skip
    fields = readonly_fields
    created_at_utc = utc_column("created_at", "Written")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(CsvTransfer)
class CsvTransferAdmin(NulFreeListMixin, admin.ModelAdmin):
    """The audit of CSV imports and exports, and the two views that make them."""

    list_display = (
        "created_at_utc", "kind", "workshop", "actor_name", "rows", "created", "unchanged",
    )  # fmt: skip
    list_select_related = ("workshop",)
    list_filter = ("kind",)
    readonly_fields = (
        "kind", "workshop", "actor_name", "created_at_utc", "filename", "integration", "rows",
        "created", "unchanged",
    )  # fmt: skip
    created_at_utc = utc_column("created_at", "When")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_urls(self):
        return [
            path(
                "import/<int:workshop_id>/",
                self.admin_site.admin_view(self.import_view),
                name="intake_import_attendees",
            ),
            path(
                "export/<int:workshop_id>/",
                self.admin_site.admin_view(self.export_view),
                name="intake_export_attendees",
            ),
            *super().get_urls(),
        ]

    def _workshop(self, request, workshop_id: int, perm: str) -> Workshop:
        if not request.user.has_perm(f"intake.{perm}"):
            raise PermissionDenied
        workshop = Workshop.objects.filter(pk=workshop_id).first()
        if workshop is None:
            raise Http404("No such workshop.")
        return workshop

    def import_view(self, request, workshop_id: int):
        """Upload, preview every row's outcome, confirm: all rows or none."""
        workshop = self._workshop(request, workshop_id, "import_attendees")
        context = {
            **self.admin_site.each_context(request),
            "title": f"Import attendees into {workshop.title}",
            "workshop": workshop,
            "opts": Workshop._meta,
            "columns": csvfile.COLUMNS,
            "max_rows": csvfile.MAX_ROWS,
            "form": ImportForm(),
        }
        if request.method != "POST":
            return TemplateResponse(request, "admin/intake/import.html", context)
        form = ImportForm(request.POST, request.FILES)
        context["form"] = form
        if not form.is_valid():
            return TemplateResponse(request, "admin/intake/import.html", context, status=400)
        try:
            read = csvfile.read_attendees(form.file_bytes())
        except csvfile.CsvRefused as error:
            context["refusal"] = str(error)
            return TemplateResponse(request, "admin/intake/import.html", context, status=400)
        integration_name = form.cleaned_data["integration"]
        # A row cancelled in the file is enrolled nowhere: not in its own workshop again, nor
        # in another one the file is imported into.
        skipped = [row for row in read.rows if row.cancelled]
        enrol = [row for row in read.rows if not row.cancelled]
        items = [EnrolmentIn(attendee=row.attendee, workshop_id=workshop.pk) for row in enrol]
        context.update(
            rows=len(read.rows),
            ignored=read.ignored,
            status_column=csvfile.STATUS,
            filename=form.filename(),
            csv_text=form.file_bytes().decode("utf-8-sig"),
        )
        if "confirm" in request.POST:
            # The preview's one-time token; a malformed one counts as none.
            token = request.POST.get("request_token", "")
            token = token if re.fullmatch("[0-9a-f]{32}", token) else None
            try:
                with transaction.atomic():
                    integration, _ = Integration.objects.get_or_create(name=integration_name)
                    # First: the same preview confirmed at once waits here for this one.
                    audit = CsvTransfer.objects.create(
                        kind=CsvTransfer.Kind.IMPORT,
                        workshop=workshop,
                        actor=request.user,
                        actor_name=request.user.get_username(),
                        created_at=default_clock().now(),
                        filename=form.filename(),
                        integration=integration.name,
                        request_token=token,
                    )
                    done = enrolments_upsert(
                        integration=integration,
                        items=items,
                        limit=csvfile.MAX_ROWS,
                        by_staff=True,
                    )
                    created = sum(r.outcome == "created" for r in done)
                    # The file's rows: those neither created nor unchanged were skipped.
                    CsvTransfer.objects.filter(pk=audit.pk).update(
                        rows=len(read.rows), created=created, unchanged=len(done) - created
                    )
            except IntegrityError:
                # The same confirmation, posted again: its first request imported the file.
                first = CsvTransfer.objects.filter(request_token=token).first() if token else None
                if first is None:
                    raise
                self.message_user(
                    request,
                    f"This file was already imported (import {first.pk}, by "
                    f"{first.actor_name}); nothing more was written.",
                    messages.WARNING,
                )
                return HttpResponseRedirect(
                    reverse("admin:workshops_workshop_change", args=[workshop.pk])
                )
            except Refused:
                pass  # shown below with each row's reason; nothing was written
            else:
                # Rows naming an attendee an earlier row enrols (the preview's repeats).
                repeats = len(done) - len({r.enrolment_id for r in done})
                self.message_user(
                    request,
                    f"Imported {plural(len(read.rows), 'row')} into {workshop.title}: "
                    f"{created} enrolled, {len(done) - created - repeats} already were"
                    + (f", {repeats} repeated an earlier row" if repeats else "")
                    + (f", {len(skipped)} not enrolled (cancelled in the file)" if skipped else "")
                    + f" (import {audit.pk}).",
                    messages.SUCCESS,
                )
                return HttpResponseRedirect(
                    reverse("admin:workshops_workshop_change", args=[workshop.pk])
                )
        preview = import_preview(integration_name, items, [row.line for row in enrol], skipped)
        # A confirmation refused although every row is valid: something changed meanwhile.
        refused = "confirm" in request.POST
        context.update(
            preview=preview,
            changed=refused and not preview.invalid,
            request_token=uuid.uuid4().hex,
        )
        status = 400 if preview.invalid else 409 if refused else 200
        return TemplateResponse(request, "admin/intake/import.html", context, status=status)

    def export_view(self, request, workshop_id: int):
        """The workshop's attendees with their enrolment and reminder status, as CSV; audited."""
        workshop = self._workshop(request, workshop_id, "export_attendees")
        integration = request.GET.get("integration", "csv").replace("\x00", "")  # none in SQL
        header, rows = export_rows(workshop, integration=integration)
        CsvTransfer.objects.create(
            kind=CsvTransfer.Kind.EXPORT,
            workshop=workshop,
            actor=request.user,
            actor_name=request.user.get_username(),
            created_at=default_clock().now(),
            integration=integration[:100],
            rows=len(rows),
        )
        response = HttpResponse(
            csvfile.write_rows(header, rows), content_type="text/csv; charset=utf-8"
        )
        response["Content-Disposition"] = (
            f'attachment; filename="workshop-{workshop.pk}-attendees.csv"'
        )
        response["Cache-Control"] = "no-store"
        return response
