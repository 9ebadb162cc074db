//! A Cluster's health per master (issue 52 row 5): which master owns each hash slot, whether
//! it answers, and failing a dead master's slots at once while every other slot is decided.
//!
//! Why the store keeps calls for a dead master away from redis-rs: its `ClusterConnection`
//! (1.8) sends a command for a slot whose master is disconnected to some other master, which
//! answers `MOVED` back to the dead one; each `MOVED` starts a slot refresh, and while one runs
//! the connection neither dispatches nor polls any command, for any slot. Under load the
//! refreshes follow one another, and the healthy masters' calls ran out `store.timeout` too
//! (a 3-master Cluster, one master killed: 0.2 % of the healthy masters' requests decided). A
//! slot whose master is down here fails with [`StoreError::Unavailable`] without a call, so
//! none of that starts.
//!
//! Each master is probed on a small connection of its own, never through the
//! `ClusterConnection`: a command routed there by address to a disconnected node makes it
//! reconnect to every seed, which stalls it too. `maintain` asks one master for `CLUSTER SLOTS`
//! and PINGs every master once a second ([`Shards::refresh`]); a master that answers is up,
//! one that does not (twice, when the first ran out its time) is down. Between those rounds, a
//! call that finds a connection lost or refused has its master PINGed at once, on its own
//! connection: the error may not be that master's (redis-rs hands a failed slot refresh's error
//! to calls for any slot), so only the PING takes it down. A call timeout alone does not: it
//! fails its own decisions only, as a Cluster's always did (on a busy proxy, a healthy master's
//! calls miss a 50 ms deadline now and then); a frozen master is found by its PINGs within a
//! second.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, Value};

use super::conn::within;
use crate::limiter::StoreError;

/// Hash slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// No master owns the slot (as far as the last `CLUSTER SLOTS` said).
const UNOWNED: u16 = u16::MAX;

/// See the module documentation.
pub(super) struct Shards {
    /// The seeds: where `CLUSTER SLOTS` is asked first, and whose settings (credentials, TLS)
    /// every probe connection takes.
    seeds: Vec<ConnectionInfo>,
    certs: Option<redis::TlsCertificates>,
    /// Bound on each probe (`store.timeout`) and on each probe connection's setup.
    timeout: Duration,
    connect_timeout: Duration,
    /// `None` until the first `CLUSTER SLOTS` answer: every slot passes until then.
    map: ArcSwapOption<SlotMap>,
    /// The stall watch runs (`maintain.rs`).
    pub(super) watching: AtomicBool,
}

/// Slot owners, as the last `CLUSTER SLOTS` said.
struct SlotMap {
    /// Per slot, its master's index in `masters`, or [`UNOWNED`].
    owner: Box<[u16]>,
    masters: Vec<Arc<Master>>,
}

/// One master's health and its probe connection.
struct Master {
    host: String,
    port: u16,
    down: AtomicBool,
    /// A PING of this master, asked for by a call, runs.
    checking: AtomicBool,
    probe: Mutex<Option<MultiplexedConnection>>,
}

impl Shards {
    /// Health for the Cluster whose seeds are `seeds`; nothing is known (every slot passes)
    /// until the first [`Shards::refresh`].
    pub(super) fn new(
        seeds: &[ConnectionInfo],
        certs: Option<redis::TlsCertificates>,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Shards {
        Shards {
            seeds: seeds.to_vec(),
            certs,
            timeout,
            connect_timeout,
            map: ArcSwapOption::empty(),
            watching: AtomicBool::new(false),
        }
    }

    /// `Ok` unless `slot`'s master is down: then the error to answer at once.
    pub(super) fn pass(&self, slot: usize) -> Result<(), StoreError> {
        let map = self.map.load();
        match map.as_ref().and_then(|m| m.master_of(slot)) {
            Some(m) if m.down.load(Ordering::Acquire) => Err(StoreError::Unavailable(format!(
                "cluster master {}:{} down",
                m.host, m.port
            ))),
            _ => Ok(()),
        }
    }

    /// A call for `slot` found a connection lost or refused: the PING of `slot`'s master to
    /// run at once (the caller spawns it), unless it is down already or one runs.
    pub(super) fn probe_owner(
        &self,
        slot: usize,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        let map = self.map.load_full()?;
        let index = usize::from(*map.owner.get(slot)?);
        let master = map.masters.get(index)?.clone();
        if master.down.load(Ordering::Acquire) || master.checking.swap(true, Ordering::AcqRel) {
            return None;
        }
        let prober = self.prober();
        Some(async move {
            if let Err(e) = prober.ping(&master).await {
                master.went_down(&e);
            }
            master.checking.store(false, Ordering::Release);
        })
    }

    /// Ask for the slot owners and PING every master (each bounded by the store's timeouts).
    /// `Ok(true)` when a master came back up (it may have lost its state), `Ok(false)` when
    /// nothing came back; `Err` when no master answered.
    pub(super) async fn refresh(&self) -> Result<bool, StoreError> {
        let old = self.map.load_full();
        match self.slots(old.as_deref()).await {
            Ok(map) => self.map.store(Some(Arc::new(map))),
            // Keep the owners known: the PINGs below still say who answers.
            Err(e) if old.is_some() => log::debug!("redis_cluster CLUSTER SLOTS failed: {e}"),
            Err(e) => return Err(e),
        }
        let Some(map) = self.map.load_full() else {
            return Err(StoreError::Unavailable("no slot map".into()));
        };
        let mut pings = tokio::task::JoinSet::new();
        for master in &map.masters {
            let (master, probe) = (master.clone(), self.prober());
            pings.spawn(async move {
                let answered = probe.ping(&master).await;
                (master, answered)
            });
        }
        let (mut any, mut back, mut last) = (false, false, None);
        while let Some(Ok((master, answered))) = pings.join_next().await {
            match answered {
                Ok(()) => {
                    any = true;
                    if master.down.swap(false, Ordering::AcqRel) {
                        log::info!("redis_cluster master {}:{} up", master.host, master.port);
                        back = true;
                    }
                }
                Err(e) => {
                    master.went_down(&e);
                    last = Some(e);
                }
            }
        }
        if any {
            Ok(back)
        } else {
            Err(last.unwrap_or_else(|| StoreError::Unavailable("no master known".into())))
        }
    }

    /// The slot owners from the first master (known ones first, then the seeds) that answers
    /// `CLUSTER SLOTS`; masters already known keep their health and probe connection.
    async fn slots(&self, old: Option<&SlotMap>) -> Result<SlotMap, StoreError> {
        let known = old.map_or(&[][..], |m| &m.masters[..]);
        let seeds = self.seeds.iter().filter_map(|s| match s.addr() {
            ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                Some(Arc::new(Master::new(host, *port)))
            }
            _ => None,
        });
        let up = known.iter().filter(|m| !m.down.load(Ordering::Acquire));
        let mut last = StoreError::Unavailable("no seed to ask".into());
        for asked in up.cloned().chain(seeds) {
            let prober = self.prober();
            let reply = async {
                let mut conn = prober.conn(&asked).await?;
                let cmd = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
                within(self.timeout, cmd.query_async::<Value>(&mut conn)).await
            };
            match reply.await {
                Ok(reply) => return SlotMap::parse(reply, &asked.host, known),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn prober(&self) -> Prober {
        Prober {
            template: self.seeds.first().cloned(),
            certs: self.certs.clone(),
            timeout: self.timeout,
            connect_timeout: self.connect_timeout,
        }
    }
}

/// What a probe needs, owned (probes run as tasks of their own).
struct Prober {
    template: Option<ConnectionInfo>,
    certs: Option<redis::TlsCertificates>,
    timeout: Duration,
    connect_timeout: Duration,
}

impl Prober {
    /// PING `master` on its probe connection (made first if need be), a second time if the
    /// first ran out its time (a busy proxy, not a dead master, is the usual reason); a
    /// failure drops the connection.
    async fn ping(&self, master: &Master) -> Result<(), StoreError> {
        let mut conn = self.conn(master).await?;
        let ping = || redis::cmd("PING");
        let mut result = within(self.timeout, ping().query_async::<Value>(&mut conn)).await;
        if matches!(result, Err(StoreError::Timeout(_))) {
            result = within(self.timeout, ping().query_async::<Value>(&mut conn)).await;
        }
        if result.is_err() {
            *master.probe.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
        result.map(drop)
    }

    /// `master`'s probe connection: the seeds' settings (credentials, TLS) at its address.
    async fn conn(&self, master: &Master) -> Result<MultiplexedConnection, StoreError> {
        if let Some(conn) = master
            .probe
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            return Ok(conn);
        }
        let template = self
            .template
            .clone()
            .ok_or_else(|| StoreError::Backend("no seed node".into()))?;
        let addr = match template.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: master.host.clone(),
                port: master.port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(master.host.clone(), master.port),
        };
        let info = template.set_addr(addr);
        let client = match &self.certs {
            Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
            None => redis::Client::open(info),
        }
        .map_err(|e| StoreError::Backend(format!("probe connection: {e}")))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(None);
        let connect = client.get_multiplexed_async_connection_with_config(&config);
        let conn = within(self.connect_timeout * 2, connect).await?;
        *master.probe.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        Ok(conn)
    }
}

impl Master {
    /// Down until it answers a PING (logged once).
    fn went_down(&self, error: &StoreError) {
        if !self.down.swap(true, Ordering::AcqRel) {
            log::warn!(
                "redis_cluster master {}:{} down ({error}): its slots fail at once until it \
                 answers a PING, the other masters' are decided as usual",
                self.host,
                self.port
            );
        }
    }

    fn new(host: &str, port: u16) -> Master {
        Master {
            host: host.to_owned(),
            port,
            down: AtomicBool::new(false),
            checking: AtomicBool::new(false),
            probe: Mutex::new(None),
        }
    }
}

impl SlotMap {
    fn master_of(&self, slot: usize) -> Option<&Master> {
        let i = *self.owner.get(slot)?;
        self.masters.get(usize::from(i)).map(|m| &**m)
    }

    /// Read a `CLUSTER SLOTS` reply (`[[start, end, [host, port, id, …], replicas…], …]`);
    /// an empty host is the node asked (`asked`). Masters in `known` are kept as they were.
    fn parse(reply: Value, asked: &str, known: &[Arc<Master>]) -> Result<SlotMap, StoreError> {
        let bad = || StoreError::Backend("unexpected CLUSTER SLOTS reply".into());
        let Value::Array(ranges) = reply else {
            return Err(bad());
        };
        let mut owner = vec![UNOWNED; SLOTS].into_boxed_slice();
        let mut masters: Vec<Arc<Master>> = Vec::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                return Err(bad());
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(node))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return Err(bad());
            };
            let host = match node.first() {
                Some(Value::BulkString(h)) if !h.is_empty() => String::from_utf8_lossy(h).into(),
                Some(Value::SimpleString(h)) if !h.is_empty() => h.clone(),
                _ => asked.to_owned(),
            };
            let Some(Value::Int(port)) = node.get(1) else {
                return Err(bad());
            };
            let port = u16::try_from(*port).map_err(|_| bad())?;
            let index = match masters
                .iter()
                .position(|m| m.host == host && m.port == port)
            {
                Some(i) => i,
                None => {
                    let kept = known.iter().find(|m| m.host == host && m.port == port);
                    masters.push(
                        kept.cloned()
                            .unwrap_or_else(|| Arc::new(Master::new(&host, port))),
                    );
                    masters.len() - 1
                }
            };
            let index = u16::try_from(index).map_err(|_| bad())?;
            let (start, end) = (usize::try_from(*start), usize::try_from(*end));
            let (Ok(start), Ok(end)) = (start, end) else {
                return Err(bad());
            };
            for slot in owner.get_mut(start..=end.min(SLOTS - 1)).ok_or_else(bad)? {
                *slot = index;
            }
        }
        Ok(SlotMap { owner, masters })
    }
}

#[cfg(test)]
mod tests;
