-- Business idempotency keys and stored HTTP responses (package idempotency).
-- {{schema}} is replaced with the quoted schema name (pgx.Identifier).

-- One row per claimed business idempotency key (a header value, a payload field, a CDC source
-- position, an outbox id) within a scope (for example a consumer group and its replay epoch).
-- A row is inserted in the same transaction as the work it guards, so "a row exists" means
-- "the work committed". key is bytea: Kafka header values may hold any bytes. A row whose
-- expires_at has passed counts as absent (it may be claimed again) and is deleted by the
-- retention janitor in small batches. 'infinity' means never expires.
CREATE TABLE IF NOT EXISTS {{schema}}.idempotency_keys (
    scope       text        NOT NULL,
    key         bytea       NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL DEFAULT 'infinity',
    PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_expires_idx ON {{schema}}.idempotency_keys (expires_at);

-- Responses stored by the Idempotency-Key HTTP middleware (IETF httpapi draft "The
-- Idempotency-Key HTTP Header Field"). A row is written in the same transaction as the
-- handler's database work, so it exists if and only if that work committed. fingerprint is
-- sha256(method, request URI, body); a later request with the same key and another fingerprint
-- is refused (422). headers holds the allow-listed response headers as a JSON object of arrays.
CREATE TABLE IF NOT EXISTS {{schema}}.idempotency_responses (
    scope        text        NOT NULL,
    key          text        NOT NULL,
    fingerprint  bytea       NOT NULL,
    method       text        NOT NULL,
    request_uri  text        NOT NULL,
    status       integer     NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}',
    body         bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS idempotency_responses_expires_idx ON {{schema}}.idempotency_responses (expires_at);
