"""Reading PostgreSQL plans in tests: how many rows a statement read only to throw away."""

from __future__ import annotations

from django.db import connection, transaction


def rows_discarded(plan: dict) -> int:
    """Rows the nodes of ``plan`` (EXPLAIN ... FORMAT JSON) read and then threw away."""
    own = plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Join Filter", 0)
    return own + sum(rows_discarded(child) for child in plan.get("Plans", ()))


def explained_discards(statements) -> dict[str, int]:
    """Run each ``(sql, params)`` under EXPLAIN ANALYZE, rolled back; return rows discarded."""
    discarded = {}
    for sql, params in statements:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
            [[[explained]]] = cursor.fetchall()
            transaction.set_rollback(True)
        discarded[sql[:60]] = rows_discarded(explained["Plan"])
    return discarded


def keeping(statements: list):
    """An execute wrapper appending each statement but savepoints to ``statements``."""

    def keep(execute, sql, params, many, context):
        if not sql.startswith(("SAVEPOINT", "RELEASE", "ROLLBACK")):
            statements.append((sql, params))
        return execute(sql, params, many, context)

    return keep


def counting_deletes(deleted: list):
    """An execute wrapper appending the rows each DELETE removed to ``deleted``."""

    def count(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.lstrip().upper().startswith("DELETE"):
            deleted.append(context["cursor"].rowcount)
        return result

    return count
