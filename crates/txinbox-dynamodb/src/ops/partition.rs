//! One `Query` of a partition of the `by_consumer` index, page after page.

use aws_sdk_dynamodb::types::AttributeValue;

use crate::error::call;
use crate::layout::{self as l, s, Item};
use crate::{DynamoError, DynamoStore};

/// One `Query` of a `by_consumer` partition, page after page.
pub(super) struct PartitionQuery<'a> {
    pub(super) partition: String,
    /// The sort key's bounds: at or after, before.
    pub(super) from: Option<String>,
    pub(super) before: Option<String>,
    pub(super) newest_first: bool,
    /// A filter expression and its values (names are `#`-prefixed attribute names, mapped as is).
    pub(super) filter: Option<&'a str>,
    pub(super) values: Vec<(&'a str, AttributeValue)>,
    pub(super) names: &'a [&'a str],
    pub(super) projection: Option<&'a str>,
    /// Stop once this many items were kept.
    pub(super) max_items: Option<usize>,
}

impl<'a> PartitionQuery<'a> {
    pub(super) fn new(partition: String) -> Self {
        Self {
            partition,
            from: None,
            before: None,
            newest_first: false,
            filter: None,
            values: Vec::new(),
            names: &[],
            projection: None,
            max_items: None,
        }
    }
}

impl DynamoStore {
    pub(super) async fn query_partition(
        &self,
        q: PartitionQuery<'_>,
    ) -> Result<Vec<Item>, DynamoError> {
        let key = match (&q.from, &q.before) {
            (None, None) => "gsi1pk = :p",
            (Some(_), None) => "gsi1pk = :p AND gsi1sk >= :from",
            (None, Some(_)) => "gsi1pk = :p AND gsi1sk < :before",
            // `BETWEEN` is inclusive; no sort key equals a bare time (each ends with `#<id>`), so `:before`
            // itself is never returned.
            (Some(_), Some(_)) => "gsi1pk = :p AND gsi1sk BETWEEN :from AND :before",
        };
        let mut out = Vec::new();
        if !l::fits_key(&q.partition) {
            return Ok(out);
        }
        let mut start = None;
        loop {
            let mut req = self
                .client
                .query()
                .table_name(&*self.table)
                .index_name(l::BY_CONSUMER)
                .key_condition_expression(key)
                .expression_attribute_values(":p", s(&q.partition))
                .scan_index_forward(!q.newest_first)
                .set_exclusive_start_key(start);
            if let Some(f) = &q.from {
                req = req.expression_attribute_values(":from", s(f));
            }
            if let Some(b) = &q.before {
                req = req.expression_attribute_values(":before", s(b));
            }
            if let Some(f) = q.filter {
                req = req.filter_expression(f);
            }
            for (k, v) in &q.values {
                req = req.expression_attribute_values(*k, v.clone());
            }
            for name in q.names {
                req = req.expression_attribute_names(format!("#{name}"), *name);
            }
            if let Some(p) = q.projection {
                req = req.projection_expression(p);
            }
            if let Some(max) = q.max_items {
                // A page never reads more than is still wanted (a filter may keep fewer: then more pages).
                req = req.limit((max - out.len()).clamp(1, 1000) as i32);
            }
            let page = req.send().await.map_err(|e| call("Query", e))?;
            for item in page.items() {
                out.push(item.clone());
                if q.max_items.is_some_and(|m| out.len() >= m) {
                    return Ok(out);
                }
            }
            match page.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => return Ok(out),
            }
        }
    }
}
