//! The conformance suite every backend passes (feature `testkit`).
//!
//! # Why
//!
//! The contract ([`WorkerRegistry`](crate::WorkerRegistry), [`Maintenance`](crate::Maintenance),
//! [`Subscribe`](crate::Subscribe)) is documented once, and a backend is only as good as its
//! agreement with that text. As object_store runs one shared integration suite against
//! `InMemory`, `LocalFileSystem`, S3, GCS and Azure alike, this module holds one suite, written
//! once against the contract traits and a small [`Fixture`], that every backend runs unchanged:
//! the in-memory one, the sequential [`ReferenceRegistry`] (the executable specification), the
//! Redis and Postgres backends against real servers with each handle on its own connection, and
//! yours. A case uses nothing but the traits and the fixture, never sleeps (time moves through
//! [`Fixture::advance`]), never assumes worker id values, and never asserts an exact time, since a
//! server's clock also moves by itself; it asserts relations, and keeps a margin of seconds on the
//! side of a boundary that real time could cross.
//!
//! # Running it against your backend
//!
//! Implement [`Fixture`] (a fresh registry per call, isolated from every other; another handle on
//! the same registry, on its own connection; a way to move the registry's time for every handle)
//! and give [`conformance_suite!`](crate::conformance_suite) an expression that builds it. This is
//! a complete test file; the in-memory backend stands in for yours, and the comments say what a
//! networked backend does instead:
//!
//! ```
//! // tests/conformance.rs, with `worker-registry = { features = ["testkit"] }` and `tokio`
//! // among the dev-dependencies.
//! use std::time::Duration;
//!
//! use worker_registry::testkit::Fixture;
//! use worker_registry::{InMemoryRegistry, ManualClock, RegistryConfig};
//!
//! /// Your backend.
//! type MyRegistry = InMemoryRegistry<ManualClock>;
//!
//! struct MyFixture;
//!
//! impl Fixture for MyFixture {
//!     type Registry = MyRegistry;
//!
//!     async fn registry(&self, config: RegistryConfig) -> MyRegistry {
//!         // Networked: connect under a name no other registry uses (a counter plus the process
//!         // id, say), so that cases running in parallel never see each other's keys or rows.
//!         InMemoryRegistry::with_clock(config, ManualClock::new())
//!     }
//!
//!     async fn replica(&self, of: &MyRegistry) -> MyRegistry {
//!         // Networked: a new connection to the same registry name: another router replica.
//!         of.clone()
//!     }
//!
//!     async fn advance(&self, of: &MyRegistry, by: Duration) {
//!         // Networked: add `by` to the registry's test-only time offset, stored server-side
//!         // so that every replica's next call sees it.
//!         of.direct().clock().advance(by);
//!     }
//! }
//!
//! worker_registry::conformance_suite!(MyFixture);
//! # fn main() {}
//! ```
//!
//! `cargo test --test conformance` then runs one test per case, named by group and case
//! (`admission::ac2_a_redelivery_is_a_duplicate_naming_its_holder`, ...). A backend whose server
//! may be missing passes an `Option` instead: a function that prints one line saying the suite is
//! skipped and how to enable it, then returns `None` (and panics instead when `CI` is set), so
//! that `conformance_suite!(my_fixture_or_skip())` skips every case. A single case can also be run
//! by hand: see [`cases`].
//!
//! This crate runs the suite against [`MemoryFixture`], [`ReferenceFixture`], and the in-memory
//! backend on a clock that moves a step on every read, as a server's clock moves while a case
//! runs (`tests/conformance.rs`); its property test (`tests/model.rs`) compares the in-memory
//! backend with [`ReferenceRegistry`] call by call.
//!
//! # The cases
//!
//! * [`admission`](cases::admission): admission and duplicate detection
//!   - `ac2_a_redelivery_is_a_duplicate_naming_its_holder`
//!   - `ac2_a_bare_claim_is_idempotent_and_releasable`
//!   - `ac2_an_unbound_claim_is_released_after_the_heartbeat_timeout`
//!   - `ac2_a_completed_claim_stays_a_duplicate_after_its_worker_is_gone`
//!   - `ac2_a_rejected_admission_leaves_no_claim_behind`
//!   - `a_duplicate_of_a_never_started_worker_says_so`
//! * [`assignment`](cases::assignment): assignment, stickiness, capacity, fencing tokens
//!   - `ac3_a_target_sticks_to_its_worker_with_increasing_tokens`
//!   - `ac3_capacity_refuses_new_targets_but_not_existing_ones`
//!   - `ac3_a_draining_target_gets_no_second_worker_until_the_first_is_dead`
//!   - `assign_places_a_target_without_claiming`
//! * [`liveness`](cases::liveness): the worker record, heartbeats, death by silence, fencing, ids
//!   - `ac1_the_record_holds_target_kind_status_heartbeat_and_times`
//!   - `ac1_worker_ids_are_never_reused`
//!   - `ac1_status_is_forward_only_and_dead_is_terminal`
//!   - `ac4_a_silent_worker_dies_and_releases_its_target_and_claims`
//!   - `ac4_heartbeats_keep_a_worker_alive_indefinitely`
//!   - `a_dead_workers_late_completion_is_refused`
//!   - `complete_by_refuses_a_worker_that_does_not_hold_the_claim`
//! * [`drain`](cases::drain): drain, drain-all and drain deadlines (`DrainTimedOut`)
//!   - `ac5_drain_then_loop_finished_is_an_exit`
//!   - `ac5_an_idle_worker_exits_at_once_when_drained`
//!   - `ac5_a_drained_workers_unfinished_deliveries_are_released`
//!   - `ac5_drain_all_drains_busy_workers_and_retires_idle_ones`
//!   - `a_worker_still_draining_at_its_deadline_dies`
//!   - `draining_again_keeps_the_earlier_deadline`
//!   - `drain_uses_the_configured_deadline`
//!   - `a_drain_deadline_is_not_held_back_by_the_brake`
//! * [`brake`](cases::brake): the mass-staleness brake and the suspect grace
//!   - `a_router_stall_suspects_everyone_and_nobody_dies_when_heartbeats_resume`
//!   - `the_suspect_grace_counts_from_the_first_suspicion`
//!   - `a_single_crash_among_many_dies_without_the_brake`
//!   - `the_brake_engages_above_the_fraction_not_at_it`
//!   - `the_brake_needs_a_minimum_number_of_live_workers`
//!   - `brake_fraction_one_disables_the_brake`
//!   - `a_genuine_mass_crash_is_suspected_first_then_dies_after_the_grace`
//!   - `in_a_mass_crash_survivors_that_beat_within_the_grace_live`
//!   - `a_recovered_suspect_that_goes_silent_later_dies_normally`
//!   - `draining_workers_take_part_in_the_brake`
//! * [`startup`](cases::startup): the start-up grace
//!   - `a_new_workers_first_heartbeat_may_come_late`
//!   - `a_new_worker_that_never_heartbeats_dies_after_the_grace`
//!   - `registered_workers_get_the_startup_grace_too`
//!   - `zero_startup_grace_means_the_plain_timeout`
//!   - `workers_in_their_startup_grace_do_not_engage_the_brake`
//!   - `a_failed_rollout_is_suspected_then_killed`
//! * [`retention`](cases::retention): claim retention and eviction, dead-record purge
//!   - `ac2_a_completed_claim_is_remembered_for_its_retention_then_forgotten`
//!   - `ac2_retained_claims_are_bounded_oldest_evicted_first`
//!   - `ac4_a_dead_record_is_purged_after_its_retention`
//! * [`released`](cases::released): released events: handed over once, to one replica, acknowledged
//!   - `released_events_are_handed_over_once_and_acknowledged`
//!   - `released_events_reach_exactly_one_replica`
//!   - `a_pair_readmitted_before_the_sweep_is_not_handed_over`
//!   - `the_audit_counts_in_flight_released_and_waiting_deliveries`
//! * [`snapshot`](cases::snapshot): snapshot consistency, versions, gauges, configuration
//!   - `ac6_the_snapshot_lists_every_worker_and_its_counts_agree`
//!   - `ac6_a_snapshot_never_changes_under_its_reader`
//!   - `status_is_what_the_last_sweep_published`
//!   - `versions_never_go_backwards_on_any_handle`
//!   - `snapshot_entries_and_gauges_agree_with_live_reads`
//!   - `the_registry_runs_with_the_configuration_given`
//! * [`registration`](cases::registration): register/deregister and the capacity they share
//!   - `a_registered_worker_lives_like_a_spawned_one`
//!   - `registration_counts_against_capacity`
//!   - `deregistering_a_draining_worker_is_an_exit`
//!   - `deregistering_releases_in_flight_deliveries`
//! * [`bad_input`](cases::bad_input): unknown ids and pairs, extreme valid input, key encoding
//!   - `unknown_worker_ids_are_refused_with_the_id`
//!   - `unknown_claims_are_refused_naming_the_pair`
//!   - `extreme_valid_input_round_trips_exactly`
//!   - `pairs_that_concatenate_alike_stay_distinct`
//! * [`events`](cases::events): lifecycle events through `Subscribe`
//!   - `lifecycle_events_arrive_in_each_workers_order`
//!   - `a_sweep_releases_each_target_in_one_event`
//!   - `hot_paths_publish_nothing`
//!   - `a_subscriber_sees_only_what_happens_after_it_subscribed`
//!   - `the_brake_publishes_suspects_not_deaths`
//!   - `a_lagging_subscriber_is_told_how_many_it_missed`
//!   - `every_handle_sees_every_event`
//!   - `a_workers_events_keep_their_order_whichever_replicas_caused_them`
//! * [`mass`](cases::mass): mass deaths large enough for a networked backend's bounded steps
//!   - `a_mass_death_is_fully_worked_off`
//!   - `released_events_of_a_chunked_death_arrive_exactly_once`
//! * [`payloads`](cases::payloads): what GitHub sent travels with its claim (on a backend that
//!   keeps payloads; the refusal on one that does not)
//!   - `a_dead_workers_deliveries_are_handed_over_with_their_payloads`
//!   - `a_stuck_delivery_is_handed_over_with_its_payload`
//!   - `a_promoted_delivery_carries_its_payload`
//!   - `a_waiting_delivery_dropped_past_max_wait_frees_its_payload`
//!   - `a_payload_is_found_while_its_delivery_has_work_left_and_gone_after`
//!   - `the_budget_refuses_past_its_bound_and_recovers_below_it`
//!   - `a_too_large_payload_is_refused_and_leaves_no_claim`
//!   - `re_dispatching_released_deliveries_needs_no_more_budget_than_they_held`
//!   - `a_released_payload_survives_the_crash_of_the_replica_that_held_it`
//!   - `racing_payloads_never_exceed_the_budget`
//! * [`races`](cases::races): multi-threaded races, one replica per racer
//!   - `one_delivery_raced_by_many_replicas_is_assigned_once`
//!   - `racing_new_targets_never_exceed_capacity`
//!   - `a_heartbeat_racing_the_sweep_is_accepted_or_dead_never_both`
//!   - `nothing_is_assigned_to_a_worker_after_its_drain_returned`
//!   - `a_completion_racing_the_workers_death_either_completes_or_is_released`
//!
//! * [`stall`](cases::stall): the stall rule: the registry's own stall is never held against
//!   its workers
//!   - `a_stall_of_the_registry_kills_nobody_even_below_the_brakes_trigger`
//!   - `a_worker_silent_across_a_stall_dies_on_registry_running_time`
//!   - `only_a_sweep_more_than_two_intervals_late_measures_a_stall`
//!   - `a_stall_moves_a_drain_deadline_out`
//! * [`stuck`](cases::stuck): deliveries stuck in flight past `max_in_flight`
//!   - `a_delivery_stuck_in_flight_is_released_and_its_worker_drained`
//!   - `an_idle_worker_holding_a_stuck_delivery_exits_at_once`
//!   - `only_deliveries_in_flight_too_long_are_stuck_and_each_is_published`
//! * [`waiting`](cases::waiting): the waiting room (every backend parks; the last case checks
//!   that with the room off a refused admission is rejected)
//!   - `a_full_registry_parks_and_deaths_promote_the_oldest_in_order`
//!   - `a_draining_targets_waiting_deliveries_go_to_its_successor`
//!   - `the_waiting_rooms_bounds_hold`
//!   - `a_delivery_waiting_past_max_wait_is_dropped_and_published`
//!   - `promotion_is_round_robin_and_the_owner_cap_holds`
//!   - `one_slot_at_a_time_serves_the_owners_in_turn`
//!   - `the_owner_cap_holds_under_races_between_replicas`
//!   - `a_promoted_delivery_survives_the_crash_of_its_replica`
//!   - `a_mass_death_promotes_every_waiting_delivery_once`
//!   - `a_sweeps_snapshot_lists_the_workers_its_promotion_placed`
//!   - `a_bare_claim_of_a_parked_pair_is_a_duplicate_and_leaves_it_waiting`
//!   - `without_parking_a_refused_admission_is_rejected`
//!
//! What needs a server restart or a lost reply is not a case: [`payload_checks`] holds those
//! checks for a networked backend's own tests to call (`tests/payloads.rs` runs them on the
//! in-memory backend).
//!
//! Worker identity across restarts is particular to the in-memory backend (a shared backend's
//! state, ids included, outlives its processes) and is tested there (`tests/lifecycle.rs`).

mod fixture;
mod memory;
mod model;
mod reference;
mod suite;
mod support;

pub mod cases;
pub mod payload_checks;

pub use fixture::{Fixture, IntoFixture};
pub use memory::MemoryFixture;
pub use reference::{ReferenceFixture, ReferenceRegistry};
