"""Suppressed addresses: why each is, and the audited lifting of one."""

from __future__ import annotations

from django.contrib import admin, messages

from reminders.admin.actions import StaffActionsMixin, confirmed_form
from reminders.admin.columns import NulFreeListMixin, plural, utc_column
from reminders.admin.forms import ReasonForm
from reminders.models import Suppression
from reminders.selectors import SelectionPreview
from reminders.services.suppression_decisions import suppressions_lift


class LiveFilter(admin.SimpleListFilter):
    title = "in force"
    parameter_name = "live"

    def lookups(self, request, model_admin):
        return [("yes", "In force"), ("no", "Lifted")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(lifted_at__isnull=self.value() == "yes")
        return queryset


@admin.register(Suppression)
class SuppressionAdmin(NulFreeListMixin, StaffActionsMixin, admin.ModelAdmin):
    list_display = ("__str__", "cause", "caused_at_utc", "created_at_utc", "lifted_at_utc")
    list_filter = ("cause", LiveFilter)
    search_fields = ("address",)
    actions = ["lift_selected"]
    readonly_fields = (
        "address", "cause", "caused_at_utc", "event", "created_at_utc", "lifted_at_utc",
        "lift_decision",
    )  # fmt: skip
    fields = readonly_fields
    caused_at_utc = utc_column("caused_at", "Reported")
    created_at_utc = utc_column("created_at", "Suppressed")
    lifted_at_utc = utc_column("lifted_at", "Lifted")

    def has_add_permission(self, request) -> bool:
        return False  # the providers' reports suppress; staff only lift

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # lifting keeps the history

    @admin.action(description="Lift selected suppressions", permissions=["change"])
    def lift_selected(self, request, queryset):
        """Preview, ask for a reason, then let reminders go to these addresses again."""
        form = confirmed_form(request, ReasonForm)
        if form.is_valid():
            decision = suppressions_lift(
                suppressions=queryset, reason=form.cleaned_data["reason"], actor=request.user
            )
            self.message_user(
                request,
                f"Lifted {plural(decision.changed, 'suppression')}: later reminders to "
                "these addresses are sent. The decision is recorded.",
                messages.SUCCESS if decision.changed else messages.WARNING,
            )
            return None
        live = queryset.filter(lifted_at__isnull=True).count()
        selected = queryset.count()
        return self._confirmation_page(
            request,
            "workshop_decision_confirmation.html",
            title="Lift the selected suppressions",
            action="lift_selected",
            explanation="Reminders to these addresses are sent again from the next one on; "
            "reminders already failed as suppressed stay failed (replay them if they still "
            "have time). If the provider bounces an address again, it is suppressed again.",
            preview=SelectionPreview(selected, live),
            eligible_label="Suppressions that will be lifted",
            effect_rows=[],
            skipped_rows=[("already lifted", selected - live)] if selected > live else [],
            submit_label=f"Yes, lift {plural(live, 'suppression')}",
            form=form,
        )
