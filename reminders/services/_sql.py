"""SQL the ORM does not write: UPDATE ... RETURNING, and parts of hand-written statements."""

from __future__ import annotations

import datetime

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import QuerySet
from django.db.models.sql import UpdateQuery


def update_returning(queryset: QuerySet, **values) -> list[tuple[int, str]]:
    """Run ``queryset.update(**values)`` and return ``(id, new status)`` of each changed row.

    Built by Django's update compiler, so a filter across relations becomes
    ``pk IN (subquery)``; only RETURNING is added.
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
        return cursor.fetchall()


def reads_database_clock(clock) -> bool:
    """Return whether statements should read the database's clock instead of ``clock``."""
    return getattr(clock, "database_now", False) and connections["default"].vendor == "postgresql"


def database_now(clock) -> datetime.datetime:
    """Return the time by the database server's clock (``clock.now()`` under a FakeClock).

    Read once per phase: a later statement judging by a time a little behind only delays what
    it decides, never brings it early.
    """
    if not reads_database_clock(clock):
        return clock.now()
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT STATEMENT_TIMESTAMP()")
        return cursor.fetchone()[0]


class StatementNow:
    """The time a hand-written statement decides by, as SQL.

    ``STATEMENT_TIMESTAMP()`` (not the transaction's ``now()``) on PostgreSQL
    under the system clock; otherwise ``now`` as a parameter.
    """

    def __init__(self, clock, now: datetime.datetime) -> None:
        self.database = reads_database_clock(clock)
        self.now = now

    def plus(self, delta: datetime.timedelta = datetime.timedelta(0)) -> tuple[str, list]:
        if self.database:
            if not delta:
                return "STATEMENT_TIMESTAMP()", []
            return "(STATEMENT_TIMESTAMP() + %s)", [delta]
        return "%s", [connections["default"].ops.adapt_datetimefield_value(self.now + delta)]


def placeholders(count: int) -> str:
    """Return ``%s, %s, ...`` with ``count`` placeholders."""
    return ", ".join(["%s"] * count)


# On PostgreSQL a list goes as one array parameter per column, so a statement's text is the same
# for any chunk size. It is sent as its literal's text: psycopg would quote each element apart.

_ARRAY_NUMBER_KINDS = frozenset({"bigint", "integer"})


def array_literal(values, kind: str) -> str:
    """Return the PostgreSQL literal of the array of ``values``, to be cast ``::<kind>[]``."""
    if kind in _ARRAY_NUMBER_KINDS:
        return "{" + ",".join(["NULL" if v is None else str(int(v)) for v in values]) + "}"
    parts = []
    for value in values:
        if value is None:
            parts.append("NULL")
            continue
        if not isinstance(value, str):
            value = value.isoformat() if isinstance(value, datetime.datetime) else str(value)
        if "\\" in value or '"' in value:
            value = value.replace("\\", "\\\\").replace('"', '\\"')
        parts.append(f'"{value}"')
    return "{" + ",".join(parts) + "}"


def one_of(connection, column: str, values: list, kind: str = "bigint") -> tuple[str, list]:
    """Return ``(sql, params)`` for "``column`` is one of ``values``" (``values`` not empty)."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s::{kind}[])", [array_literal(values, kind)]
    return f"{column} IN ({placeholders(len(values))})", list(values)


def rows_cte(connection, name: str, columns: dict[str, str], rows: list[tuple]) -> tuple[str, list]:
    """Return ``(sql, params)`` for the CTE ``name (columns...)`` holding ``rows``.

    ``columns`` maps names to PostgreSQL types; ``rows`` may be empty only on PostgreSQL.
    """
    names = ", ".join(columns)
    if connection.vendor == "postgresql":
        arrays = ", ".join(f"%s::{kind}[]" for kind in columns.values())
        values = list(zip(*rows, strict=True)) or [()] * len(columns)
        params = [
            array_literal(column, kind)
            for column, kind in zip(values, columns.values(), strict=True)
        ]
        return f"{name} ({names}) AS (SELECT * FROM unnest({arrays}))", params
    each = f"({placeholders(len(rows[0]))})"
    return (
        f"{name} ({names}) AS (VALUES {', '.join([each] * len(rows))})",
        [value for row in rows for value in row],
    )


def claim_token_param(token):
    """Return a claim token as this database stores it (uuid on PostgreSQL, hex on SQLite)."""
    from reminders.models import Reminder

    connection = connections[Reminder.objects.db]
    return Reminder._meta.get_field("claim_token").get_db_prep_value(token, connection)


def _compiled_timestamps(cursor) -> None:
    """Read ``timestamptz`` with psycopg's compiled loader (in UTC it returns what Django's does)."""
    connection = cursor.db
    if connection.vendor == "postgresql" and connection.timezone is datetime.UTC:
        from psycopg.types.datetime import TimestamptzLoader  # the compiled one, once registered

        cursor.cursor.adapters.register_loader("timestamptz", TimestamptzLoader)


class RowsWithRelated:
    """What ``select_related(*related)`` returns, with the SQL built once per database alias.

    Rows become instances through ``Model.from_db``, converters applied, as in the
    ORM. The base table's alias in ``where`` and ``order`` is ``r``.
    """

    def __init__(self, model, related: tuple[str, ...]) -> None:
        self.model = model
        self.related = tuple(model._meta.get_field(name) for name in related)
        self._built: dict[tuple, tuple[str, list]] = {}

    def read(self, cursor, *, where: str, order: str, params: list) -> list:
        rows = self.read_with(cursor, where=where, order=order, params=params)
        return [base for base, _ in rows]

    def read_with(
        self,
        cursor,
        *,
        order: str,
        params: list,
        where: str = "",
        prefix: str = "",
        source: str = "",
        extra: tuple[str, ...] = (),
    ) -> list[tuple]:
        """Return ``(instance, (extra values...))`` per row, in ``order``.

        ``prefix`` goes before the SELECT (a ``WITH``), ``source`` replaces the base table,
        ``extra`` adds columns; ``params`` are the prefix's, then the where's.
        """
        connection = cursor.db
        # Built once per alias and backend: some converters read the alias's settings.
        key = (connection.alias, type(connection.ops))
        if (built := self._built.get(key)) is None:
            built = self._built[key] = self._build(connection)
        columns, joins, parts = built
        table = source or connection.ops.quote_name(self.model._meta.db_table)
        selected = columns + "".join(f", {column}" for column in extra)
        sql = f"{prefix}SELECT {selected} FROM {table} r {joins}"
        if where:
            sql += f" WHERE {where}"
        _compiled_timestamps(cursor)
        cursor.execute(f"{sql} ORDER BY {order}", params)
        db = connection.alias
        found = []
        extras_start = parts[-1][1]
        for row in cursor.fetchall():
            instances = []
            for start, stop, key, part_model, converters in parts:
                values = list(row[start:stop])
                for index, field_converters, column in converters:
                    for convert in field_converters:
                        values[index] = convert(values[index], column, connection)
                instances.append(
                    None if values[key] is None else part_model.from_db(db, None, values)
                )
            base = instances[0]
            for field, instance in zip(self.related, instances[1:], strict=True):
                field.set_cached_value(base, instance)
            found.append((base, row[extras_start:]))
        return found

    def _build(self, connection) -> tuple[str, str, list]:
        quote = connection.ops.quote_name
        aliases = [("r", self.model, None)] + [
            (f"j{number}", field.related_model, field) for number, field in enumerate(self.related)
        ]
        columns, joins, parts = [], [], []
        for alias, part_model, field in aliases:
            fields = part_model._meta.concrete_fields
            # A LEFT JOIN's missing row is told by its primary key being NULL.
            key = fields.index(part_model._meta.pk)
            converters = []
            for index, model_field in enumerate(fields):
                column = model_field.get_col(alias)
                found = connection.ops.get_db_converters(column)
                found += column.get_db_converters(connection)
                if found:
                    converters.append((index, found, column))
                columns.append(f"{alias}.{quote(model_field.column)}")
            start = len(columns) - len(fields)
            parts.append((start, len(columns), key, part_model, converters))
            if field is not None:
                kind = "LEFT JOIN" if field.null else "JOIN"
                joins.append(
                    f"{kind} {quote(part_model._meta.db_table)} {alias} "
                    f"ON {alias}.{quote(field.target_field.column)} = r.{quote(field.column)}"
                )
        return ", ".join(columns), " ".join(joins), parts
