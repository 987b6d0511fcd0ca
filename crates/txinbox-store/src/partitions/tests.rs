//! Unit tests of the partitioned layout's DDL.

#[test]
fn a_unique_index_gets_the_partition_key_after_its_own_columns() {
    let def = "CREATE UNIQUE INDEX k ON s.t USING btree (consumer_name, COALESCE(tenant_id, ''::text), business_key) WHERE (business_key IS NOT NULL)";
    assert_eq!(
        super::pg::with_partition_key(def, "created_at").unwrap(),
        "CREATE UNIQUE INDEX k ON s.t USING btree (consumer_name, COALESCE(tenant_id, ''::text), business_key, created_at) WHERE (business_key IS NOT NULL)"
    );
    assert_eq!(
        super::pg::with_partition_key("CREATE UNIQUE INDEX k ON t", "c"),
        None
    );
}
