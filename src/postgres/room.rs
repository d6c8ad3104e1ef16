//! The waiting room's settings on the server: every handle's connect writes the limits a call
//! that frees a slot promotes with (`wr_room`; the steps are `wr_park`,
//! `wr_promote` and `wr_sweep_expire_waiting` in `functions/waiting.sql`, the design in
//! `docs::postgres`, "The waiting room").

use super::rows::col;
use super::PostgresRegistry;
use crate::api::error::RegistryError;

const ROOM_OPEN: &str = "SELECT 1::int4 AS n FROM wr_room_open($1, $2, $3, $4, $5)";

impl PostgresRegistry {
    /// Writes this handle's capacity, per-owner cap, retention and unbound timeout to the
    /// registry's room row (a no-op write when they are unchanged). A death in `loop_finished`
    /// or `deregister` promotes into the slot it freed with them.
    pub(super) async fn open_room(&self) -> Result<(), RegistryError> {
        let inner = &*self.inner;
        let p = &inner.params;
        self.call(
            ROOM_OPEN,
            &[
                &inner.id,
                &p.max_workers,
                &p.owner_cap,
                &p.retention,
                &p.timeout,
            ],
            |row| col::<i32>(row, "n"),
        )
        .await
        .map(|_| ())
    }
}
