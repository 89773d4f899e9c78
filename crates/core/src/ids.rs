//! Identifiers and the shard map.

use serde::{Deserialize, Serialize};

/// Index of an embedding table (one per categorical feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TableId(pub u32);

/// Index of a row inside its table.
pub type RowId = u64;

/// Index of a parameter-server process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServerId(pub u32);

/// Places rows on servers.
///
/// Row `r` of table `t` lives on server `(r + t) mod n`. Round-robin by row spreads the hot
/// head of a Zipf-distributed table evenly (a range split would put every hot row on one
/// server); offsetting by the table id keeps the tiny tables (3 or 4 rows) from all landing on
/// server 0. Within a server, a table's rows are stored densely at local index `r / n`: the rows
/// of one server form one residue class mod `n`, so `r / n` numbers them 0, 1, 2, ... and a
/// shard needs no id map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMap {
    servers: u32,
}

impl ShardMap {
    /// A map over `servers` servers; `servers` must be at least 1.
    pub fn new(servers: u32) -> Result<Self, crate::CoreError> {
        if servers == 0 {
            return Err(crate::CoreError::InvalidConfig(
                "a shard map needs at least one server".into(),
            ));
        }
        Ok(ShardMap { servers })
    }

    pub fn servers(&self) -> u32 {
        self.servers
    }

    /// The server that owns row `row` of `table`.
    #[inline]
    pub fn owner(&self, table: TableId, row: RowId) -> ServerId {
        let n = self.servers as u64;
        ServerId(((row % n + table.0 as u64 % n) % n) as u32)
    }

    /// Index of `row` among the rows of `table` that its owner holds.
    #[inline]
    pub fn local_index(&self, _table: TableId, row: RowId) -> u64 {
        row / self.servers as u64
    }

    /// The residue class (row mod n) of `table`'s rows that `server` holds.
    fn residue(&self, table: TableId, server: ServerId) -> u64 {
        let n = self.servers as u64;
        (server.0 as u64 % n + n - table.0 as u64 % n) % n
    }

    /// Global row id of local index `local` of `table` on `server`.
    pub fn global_row(&self, table: TableId, server: ServerId, local: u64) -> RowId {
        local * self.servers as u64 + self.residue(table, server)
    }

    /// How many rows of a table with `rows` rows `server` holds.
    pub fn rows_on(&self, table: TableId, rows: u64, server: ServerId) -> u64 {
        let n = self.servers as u64;
        let c = self.residue(table, server);
        rows / n + u64::from(rows % n > c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_map_is_a_bijection() {
        for servers in 1..6u32 {
            let map = ShardMap::new(servers).unwrap();
            for t in 0..5u32 {
                let table = TableId(t);
                let rows = 37u64;
                let mut seen = vec![false; rows as usize];
                for s in 0..servers {
                    let n = map.rows_on(table, rows, ServerId(s));
                    for local in 0..n {
                        let r = map.global_row(table, ServerId(s), local);
                        assert!(r < rows, "row {r} out of range");
                        assert_eq!(map.owner(table, r), ServerId(s));
                        assert_eq!(map.local_index(table, r), local);
                        assert!(!seen[r as usize], "row {r} placed twice");
                        seen[r as usize] = true;
                    }
                }
                assert!(seen.iter().all(|&b| b), "some row has no owner");
            }
        }
    }

    #[test]
    fn zero_servers_is_an_error() {
        assert!(ShardMap::new(0).is_err());
    }
}
