-- worker-registry on PostgreSQL: what a lost reply and a changed configuration need.
--
-- Applied once, after 0001-0005. Schema only: the functions are in `src/postgres/functions.sql`.
--
-- wr_admit and wr_claim answer a duplicate with whether its holder never heartbeated
-- (o_unstarted: the reply that told a router to start it may have been lost); a new OUT column
-- changes their signatures, so the old ones go first.
DROP FUNCTION wr_admit(bigint, text, bigint, text, bigint, bigint, bigint);
DROP FUNCTION wr_claim(bigint, text, bigint, text, bigint, bigint);

-- The limits that decide, as the first replica to open the registry set them (a JSON object of
-- integers, see `src/postgres/agreement.rs`); NULL until then.
ALTER TABLE wr_registries ADD COLUMN config jsonb;
