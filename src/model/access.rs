//! Access control: what an access token may do, in S2's terms (its `/v1/access-tokens` scope),
//! applied to every face. Pure rules: the service stores tokens, the faces classify requests.
//!
//! A scope names the basins (buckets), streams and access tokens it covers, each as an exact
//! name or a prefix, and the operations it permits, as operation groups (account / basin /
//! stream, each read and/or write) and single operations. An operation is allowed on a resource
//! when the operation is permitted and every name the resource has is covered.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// S2's operations. Every request to any face is one of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    ListBasins,
    CreateBasin,
    DeleteBasin,
    ReconfigureBasin,
    GetBasinConfig,
    IssueAccessToken,
    RevokeAccessToken,
    ListAccessTokens,
    ListStreams,
    CreateStream,
    DeleteStream,
    GetStreamConfig,
    ReconfigureStream,
    CheckTail,
    Append,
    Read,
    Trim,
    Fence,
    AccountMetrics,
    BasinMetrics,
    StreamMetrics,
    ListLocations,
    GetDefaultLocation,
    SetDefaultLocation,
}

/// The level an operation group works at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Account,
    Basin,
    Stream,
}

impl Operation {
    pub const ALL: [Operation; 24] = [
        Operation::ListBasins,
        Operation::CreateBasin,
        Operation::DeleteBasin,
        Operation::ReconfigureBasin,
        Operation::GetBasinConfig,
        Operation::IssueAccessToken,
        Operation::RevokeAccessToken,
        Operation::ListAccessTokens,
        Operation::ListStreams,
        Operation::CreateStream,
        Operation::DeleteStream,
        Operation::GetStreamConfig,
        Operation::ReconfigureStream,
        Operation::CheckTail,
        Operation::Append,
        Operation::Read,
        Operation::Trim,
        Operation::Fence,
        Operation::AccountMetrics,
        Operation::BasinMetrics,
        Operation::StreamMetrics,
        Operation::ListLocations,
        Operation::GetDefaultLocation,
        Operation::SetDefaultLocation,
    ];

    /// The operation group an operation belongs to, and whether it writes.
    pub fn group(self) -> (Level, bool) {
        use Operation::*;
        match self {
            ListBasins | AccountMetrics | ListAccessTokens | ListLocations | GetDefaultLocation => {
                (Level::Account, false)
            }
            CreateBasin | DeleteBasin | IssueAccessToken | RevokeAccessToken
            | SetDefaultLocation => (Level::Account, true),
            ListStreams | GetBasinConfig | GetStreamConfig | BasinMetrics => (Level::Basin, false),
            CreateStream | DeleteStream | ReconfigureBasin | ReconfigureStream => {
                (Level::Basin, true)
            }
            CheckTail | Read | StreamMetrics => (Level::Stream, false),
            Append | Trim | Fence => (Level::Stream, true),
        }
    }
}

/// Names covered by a scope: none, one exactly, or every name with a prefix (`""`: all).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NameSet {
    Exact(String),
    Prefix(String),
}

impl NameSet {
    pub fn covers(this: Option<&NameSet>, name: &str) -> bool {
        match this {
            None => false,
            Some(NameSet::Exact(exact)) => !exact.is_empty() && exact == name,
            Some(NameSet::Prefix(prefix)) => name.starts_with(prefix.as_str()),
        }
    }

    /// Whether every name `inner` covers, `outer` covers too.
    fn within(inner: Option<&NameSet>, outer: Option<&NameSet>) -> bool {
        match inner {
            None => true,
            Some(NameSet::Exact(e)) if e.is_empty() => true,
            Some(NameSet::Exact(e)) => NameSet::covers(outer, e),
            Some(NameSet::Prefix(p)) => match outer {
                Some(NameSet::Prefix(q)) => p.starts_with(q.as_str()),
                _ => false,
            },
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadWrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write: Option<bool>,
}

impl ReadWrite {
    fn permits(self, write: bool) -> bool {
        if write {
            self.write.unwrap_or(false)
        } else {
            self.read.unwrap_or(false)
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationGroups {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<ReadWrite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basin: Option<ReadWrite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<ReadWrite>,
}

/// An access token's scope, as S2 spells it in JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basins: Option<NameSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<NameSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_tokens: Option<NameSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_groups: Option<OperationGroups>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ops: Option<Vec<Operation>>,
}

/// What a request touches. Streams of the base surface (`/v1/stream/…`) belong to the basin
/// named `""`, so only a scope covering every basin reaches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource<'a> {
    /// The account as a whole: listings (filtered per item) and metrics.
    Account,
    Basin(&'a str),
    Stream {
        basin: &'a str,
        stream: &'a str,
    },
    AccessToken(&'a str),
}

impl Scope {
    /// Everything: the operator's scope.
    pub fn everything() -> Scope {
        let all = ReadWrite {
            read: Some(true),
            write: Some(true),
        };
        Scope {
            basins: Some(NameSet::Prefix(String::new())),
            streams: Some(NameSet::Prefix(String::new())),
            access_tokens: Some(NameSet::Prefix(String::new())),
            op_groups: Some(OperationGroups {
                account: Some(all),
                basin: Some(all),
                stream: Some(all),
            }),
            ops: None,
        }
    }

    /// Whether the scope permits the operation at all, whatever the resource.
    pub fn permits_operation(&self, op: Operation) -> bool {
        if self.ops.as_ref().is_some_and(|ops| ops.contains(&op)) {
            return true;
        }
        let groups = self.op_groups.clone().unwrap_or_default();
        let (level, write) = op.group();
        let group = match level {
            Level::Account => groups.account,
            Level::Basin => groups.basin,
            Level::Stream => groups.stream,
        };
        group.is_some_and(|g| g.permits(write))
    }

    pub fn covers_basin(&self, basin: &str) -> bool {
        NameSet::covers(self.basins.as_ref(), basin)
    }

    pub fn covers_stream(&self, basin: &str, stream: &str) -> bool {
        self.covers_basin(basin) && NameSet::covers(self.streams.as_ref(), stream)
    }

    /// Whether the scope covers a basin and every stream in it (replicating a whole bucket
    /// needs this).
    pub fn covers_whole_basin(&self, basin: &str) -> bool {
        self.covers_basin(basin) && self.streams == Some(NameSet::Prefix(String::new()))
    }

    pub fn covers_token(&self, id: &str) -> bool {
        NameSet::covers(self.access_tokens.as_ref(), id)
    }

    /// Whether the scope allows `op` on `resource`.
    pub fn allows(&self, op: Operation, resource: Resource<'_>) -> bool {
        self.permits_operation(op)
            && match resource {
                Resource::Account => true,
                Resource::Basin(basin) => self.covers_basin(basin),
                Resource::Stream { basin, stream } => self.covers_stream(basin, stream),
                Resource::AccessToken(id) => self.covers_token(id),
            }
    }

    fn permitted_operations(&self) -> BTreeSet<Operation> {
        Operation::ALL
            .into_iter()
            .filter(|op| self.permits_operation(*op))
            .collect()
    }

    /// Whether a token with this scope may be issued by one with `issuer`: it can do nothing
    /// the issuer cannot.
    pub fn within(&self, issuer: &Scope) -> bool {
        self.permitted_operations()
            .is_subset(&issuer.permitted_operations())
            && NameSet::within(self.basins.as_ref(), issuer.basins.as_ref())
            && NameSet::within(self.streams.as_ref(), issuer.streams.as_ref())
            && NameSet::within(self.access_tokens.as_ref(), issuer.access_tokens.as_ref())
    }
}

/// An issued token as stored: never the secret, only its SHA-256 digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: String,
    /// Hex SHA-256 of the secret.
    pub digest: String,
    /// Milliseconds since the Unix epoch; none: never expires.
    pub expires_ms: Option<i64>,
    pub scope: Scope,
    pub created_ms: i64,
    /// The token whose request budget (`--rate-limit`) this one spends: the token the operator
    /// issued at the head of its chain of issuers. None for a token the operator issued, which
    /// spends its own; so issuing tokens cannot multiply a holder's budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_budget: Option<String>,
}

/// The hex SHA-256 digest of a secret (tokens are stored and looked up by it).
pub fn digest(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whether two digests are equal, in time independent of where they differ.
pub fn same_digest(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The rule for access token ids: 1 to 96 bytes of printable ASCII without spaces.
pub fn valid_token_id(id: &str) -> bool {
    (1..=96).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scope(value: serde_json::Value) -> Scope {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn a_stream_reader_reads_its_streams_and_nothing_else() {
        let reader = scope(json!({
            "basins": {"exact": "logs"},
            "streams": {"prefix": "app/"},
            "op_groups": {"stream": {"read": true}}
        }));
        let app = Resource::Stream {
            basin: "logs",
            stream: "app/1",
        };
        assert!(reader.allows(Operation::Read, app));
        assert!(reader.allows(Operation::CheckTail, app));
        assert!(!reader.allows(Operation::Append, app), "read only");
        let other_stream = Resource::Stream {
            basin: "logs",
            stream: "db/1",
        };
        assert!(!reader.allows(Operation::Read, other_stream));
        let other_basin = Resource::Stream {
            basin: "secret",
            stream: "app/1",
        };
        assert!(!reader.allows(Operation::Read, other_basin));
        assert!(!reader.allows(Operation::ListBasins, Resource::Account));
    }

    #[test]
    fn single_operations_add_to_the_groups() {
        let appender = scope(json!({
            "basins": {"prefix": ""},
            "streams": {"prefix": ""},
            "ops": ["append"]
        }));
        let s = Resource::Stream {
            basin: "b",
            stream: "s",
        };
        assert!(appender.allows(Operation::Append, s));
        assert!(!appender.allows(Operation::Read, s));
    }

    #[test]
    fn an_empty_exact_name_covers_nothing() {
        let none = scope(json!({"basins": {"exact": ""}, "op_groups": {"basin": {"read": true}}}));
        assert!(!none.allows(Operation::ListStreams, Resource::Basin("")));
    }

    #[test]
    fn an_issued_scope_stays_within_its_issuer() {
        let issuer = scope(json!({
            "basins": {"prefix": "team-"},
            "streams": {"prefix": ""},
            "access_tokens": {"prefix": "team-"},
            "op_groups": {"stream": {"read": true, "write": true}},
            "ops": ["issue-access-token"]
        }));
        let narrower = scope(json!({
            "basins": {"exact": "team-a"},
            "streams": {"prefix": "x"},
            "op_groups": {"stream": {"read": true}}
        }));
        assert!(narrower.within(&issuer));
        let wider_basins = scope(json!({"basins": {"prefix": "t"}}));
        assert!(!wider_basins.within(&issuer));
        let more_ops = scope(json!({"ops": ["delete-basin"]}));
        assert!(!more_ops.within(&issuer));
        assert!(issuer.within(&Scope::everything()));
    }

    #[test]
    fn digests_compare_by_value() {
        assert!(same_digest(&digest("s3cret"), &digest("s3cret")));
        assert!(!same_digest(&digest("s3cret"), &digest("s3creT")));
        assert!(!same_digest("ab", "abc"));
    }
}
