"""SQL that Django's ORM does not write for us: an UPDATE that reports the rows it changed,
and the pieces of the hand-written statements (VALUES lists, the claim token as a parameter)."""

from __future__ import annotations

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import QuerySet
from django.db.models.sql import UpdateQuery


def update_returning(queryset: QuerySet, **values) -> list[tuple[int, str]]:
    """Run ``queryset.update(**values)`` as one ``UPDATE ... RETURNING id, status``.

    Return ``(id, new status)`` of every row the UPDATE changed, so callers count
    what happened in the database, not what they asked for. Built by Django's own
    update compiler (as ``QuerySet.update`` is), so a filter across relations
    becomes ``pk IN (subquery)`` in the same statement; only RETURNING is added.
    PostgreSQL and SQLite (3.35 and newer) both support it.
    """
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(values)
    query.annotations = {}
    connection = connections[queryset.db]
    try:
        sql, params = query.get_compiler(queryset.db).as_sql()
    except EmptyResultSet:
        return []
    meta = queryset.model._meta
    table = connection.ops.quote_name(meta.db_table)
    pk = connection.ops.quote_name(meta.pk.column)
    status = connection.ops.quote_name("status")
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING {table}.{pk}, {table}.{status}", params)
        return [(row[0], row[1]) for row in cursor.fetchall()]


def values_rows(rows: list[tuple]) -> str:
    """Return ``(%s, ...), ...`` for ``rows`` of equal length: the body of a VALUES list."""
    row = "(" + ", ".join(["%s"] * len(rows[0])) + ")"
    return ", ".join([row] * len(rows))


def claim_token_param(token):
    """Return a claim token as this database stores it (uuid on PostgreSQL, hex on SQLite)."""
    from reminders.models import Reminder

    connection = connections[Reminder.objects.db]
    return Reminder._meta.get_field("claim_token").get_db_prep_value(token, connection)
