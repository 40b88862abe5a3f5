//! The statements over input and published rows whose rules issue 39 set:
//! the insert (what a reused ID does) and the delete (by the incarnation
//! published). Prepared on each connection by `pg.rs`.

/// The server's clock at the statement's start, as a `timestamp` in UTC
/// (the table's times are UTC, as the nodes write deadlines).
pub(super) const SERVER_NOW: &str = "(now() AT TIME ZONE 'UTC')";

/// The insert of a batch (`UNNEST` arrays): each row is stored unless its
/// ID is in the table already (`DO NOTHING`; an ID twice in one statement
/// is stored once, as its first message). It returns each ID stored
/// (`true`) and each ID kept out by a row that is claimed, or due within
/// the look-ahead (`$6`, ms) and so about to be (`false`: the statement's
/// snapshot, before its own inserts; an ID may come back as both when the
/// row's delete committed while the statement waited for it: stored). A
/// message whose ID belongs to a row waiting further out is a duplicate,
/// ignored as seed 004 says; one whose ID belongs to a claimed row
/// (ready, perhaps published with its delete on the way, or reset by a
/// takeover and claimed again at once) is a new message the enqueue holds
/// back until that row is gone (`enqueue.rs`): it used to be dropped, its
/// offset committed, and the old row then deleted (issue 39); and a
/// claimed row is never overwritten, so the older message is not lost
/// either should its holder die before publishing it. Only the IDs not
/// stored are looked up again (none, mostly: the look-up of every ID cost
/// Postgres a second index probe per row).
pub(super) fn insert_sql(t: &str) -> String {
    format!(
        "WITH stored AS (
             INSERT INTO {t} (id, deadline, message_headers, message_key, message_value)
             SELECT DISTINCT ON (i) i, d, h::jsonb, k, v
             FROM UNNEST($1::text[], $2::timestamp[], $3::text[], $4::bytea[], $5::bytea[])
                 WITH ORDINALITY AS m(i, d, h, k, v, n)
             ORDER BY i, n
             ON CONFLICT (id) DO NOTHING
             RETURNING id)
         SELECT id::text, true FROM stored
         UNION ALL
         SELECT id::text, false FROM {t}
         WHERE id = ANY(ARRAY(SELECT unnest($1::text[]) EXCEPT SELECT id::text FROM stored))
             AND (readied_at IS NOT NULL
                  OR deadline <= {SERVER_NOW} + $6::bigint * interval '1 millisecond')"
    )
}

/// The delete of published rows: each named by its ID and the incarnation
/// published (`$2`, its deadline, and `$3`, this node as its holder),
/// never by ID alone, so that a newer message with the same ID (stored
/// once a node that took the row over deleted it: [`insert_sql`]), or a
/// row taken over by another node after a suspected failure, is left
/// alone. The
/// latter is then published again by its new holder: a duplicate, as at
/// least once allows, never a loss. The rows are found by the primary key
/// (`id = ANY`), then matched with their incarnations: joined on the ID
/// alone, the planner merged the whole primary-key index with the list
/// (70 ms for 2,000 IDs among 100,000 rows, against 17 ms this way and
/// 11 ms for the delete by ID alone).
pub(super) fn delete_sql(t: &str) -> String {
    format!(
        "DELETE FROM {t} USING UNNEST($1::text[], $2::timestamp[]) AS d(i, dl)
         WHERE {t}.id = ANY($1::text[]) AND {t}.id = d.i AND {t}.deadline = d.dl
           AND {t}.readied_by = $3::text::uuid
         RETURNING {t}.id"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 39: a delete names the incarnation published, and finds its
    /// rows by the primary key.
    #[test]
    fn the_delete_names_the_incarnation_and_probes_the_primary_key() {
        let sql = delete_sql("t");
        assert!(sql.contains("t.id = ANY($1::text[])"), "{sql}");
        assert!(sql.contains("t.deadline = d.dl"), "{sql}");
        assert!(sql.contains("t.readied_by = $3::text::uuid"), "{sql}");
    }
}
