-- Offset accounting: watermark moves made outside kafkatx are logged in offset_audit, so the
-- accounting report (`kafkatx offsets account`) can tell a gap from a processed range.
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).
--
-- How a move is recognised as kafkatx's own, at no extra cost per batch:
--   * every kafkatx writer sets updated_at = now() in the UPDATE that moves next_offset
--     (the consumer's compare-and-set advance, its follow of an operator skip, and the
--     operator commands), so a forward move whose row carries the transaction's timestamp
--     is kafkatx's;
--   * a backward move is never made by the consumer loop; the operator command that makes
--     one (`offsets reset --mode replay`) first sets the transaction-local setting
--     kafkatx.audit_id to the id of its audit row.
-- Anything else — `UPDATE ... SET next_offset = N` by hand, any rewind without the setting —
-- is written to offset_audit as kind 'unexplained_move' (from_offset = old watermark,
-- to_offset = new watermark; to < from for a rewind). Deleting a watermark row is logged as
-- 'watermark_deleted' ([first_offset, next_offset) of the deleted row).
-- The trigger's WHEN clause is false for the consumer's advances, so the function never runs
-- on the hot path: the per-batch cost is the evaluation of that clause.

CREATE OR REPLACE FUNCTION {{schema}}.log_unexplained_watermark_move() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    who text := session_user || '@' || coalesce(host(inet_client_addr()), 'local')
        || coalesce(' (' || nullif(current_setting('application_name', true), '') || ')', '');
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO {{schema}}.offset_audit (group_id, topic, partition, kind, from_offset, to_offset, reason, actor)
        VALUES (OLD.group_id, OLD.topic, OLD.partition, 'watermark_deleted', OLD.first_offset, OLD.next_offset,
                'watermark row deleted outside kafkatx', who);
        RETURN OLD;
    END IF;
    IF coalesce(current_setting('kafkatx.audit_id', true), '') <> '' THEN
        RETURN NEW; -- an audited operator command (its own offset_audit row explains the move)
    END IF;
    INSERT INTO {{schema}}.offset_audit (group_id, topic, partition, kind, from_offset, to_offset, reason, actor)
    VALUES (NEW.group_id, NEW.topic, NEW.partition, 'unexplained_move', OLD.next_offset, NEW.next_offset,
            CASE WHEN NEW.next_offset > OLD.next_offset
                 THEN 'watermark moved forward outside kafkatx: offsets skipped with no record'
                 ELSE 'watermark moved back outside kafkatx: offsets will be processed again' END,
            who);
    RETURN NEW;
END
$$;

DROP TRIGGER IF EXISTS watermarks_unexplained_move ON {{schema}}.watermarks;
CREATE TRIGGER watermarks_unexplained_move
    AFTER UPDATE OF next_offset ON {{schema}}.watermarks
    FOR EACH ROW
    WHEN (NEW.next_offset <> OLD.next_offset
          AND (NEW.next_offset < OLD.next_offset OR NEW.updated_at IS DISTINCT FROM now()))
    EXECUTE FUNCTION {{schema}}.log_unexplained_watermark_move();

DROP TRIGGER IF EXISTS watermarks_deleted ON {{schema}}.watermarks;
CREATE TRIGGER watermarks_deleted
    AFTER DELETE ON {{schema}}.watermarks
    FOR EACH ROW
    EXECUTE FUNCTION {{schema}}.log_unexplained_watermark_move();

-- Accounting and status read the latest events of a partition by kind.
CREATE INDEX IF NOT EXISTS offset_audit_kind_idx ON {{schema}}.offset_audit (group_id, topic, partition, kind, status);
