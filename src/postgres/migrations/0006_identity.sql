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

-- The registry's incarnation: a value chosen when its row is created, and changed by the first
-- handle that finds the data rewound (a failover to a standby that lagged, a restore), so that
-- every other handle finds the loss too (see `src/postgres/loss.rs`).
ALTER TABLE wr_registries ADD COLUMN epoch text NOT NULL DEFAULT md5(random()::text);
