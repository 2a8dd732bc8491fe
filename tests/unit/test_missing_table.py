"""What ``dcp-cdc sql`` says of a name the catalog lacks (:func:`pipelines.tables.missing_table`):
a configured bucket that has not reached the layer yet, or a wrong name with the closest ones."""

from __future__ import annotations

import pytest

from pipelines.tables import missing_database, missing_table, name_owner

LIVE = "silver.travel_sample_a8560dff___default___default"
SILVER = [
    "silver.travel_sample_a8560dff___default___default",
    "silver.travel_sample_a8560dff___default___default_all",
    "silver.travel_sample_a8560dff__collections",
    "silver.travel_sample_a8560dff__inventory__airline",
    "silver.travel_sample_a8560dff__inventory__airline_all",
]
BRONZE = ["bronze.travel_sample_a8560dff_events", "bronze.travel_sample_a8560dff_ingest_log"]
BUCKETS = ["travel-sample", "beer-sample"]


@pytest.mark.parametrize(
    ("name", "owner"),
    [
        (LIVE, ("travel-sample", "silver")),
        ("silver.travel_sample_a8560dff__inventory__hotel_all", ("travel-sample", "silver")),
        ("bronze.travel_sample_a8560dff_events", ("travel-sample", "bronze")),
        ("quality.beer_sample_42d38c1b_results", ("beer-sample", "quality")),
        ("silver.travel_sample___default___default", None),  # not the bucket's identifier
        ("silver.travel_sample_a8560dff_collections", None),  # silver's separator is __
        ("default.travel_sample_a8560dff___default___default", None),  # not a layer
        ("travel_sample_a8560dff___default___default", None),  # no layer
    ],
)
def test_a_name_belongs_to_a_bucket_and_layer_by_its_prefix(
    name: str, owner: tuple[str, str] | None
) -> None:
    assert name_owner(name, BUCKETS) == owner


def test_the_longest_identifier_owns_a_name() -> None:
    assert name_owner("silver.a_b__s__c", ["a", "a_b"]) == ("a_b", "silver")
    assert name_owner("bronze.a_b_events", ["a", "a_b"]) == ("a_b", "bronze")


def test_a_bucket_not_applied_yet_says_so_and_what_to_run() -> None:
    """Bronze has the bucket's tables, silver none: the query came before the first apply."""
    assert missing_table(LIVE, BUCKETS, BRONZE) == (
        f"{LIVE} does not exist yet: bucket 'travel-sample' has not been applied yet (silver "
        "holds none of its tables): run `dcp-cdc ingest` and `dcp-cdc apply` first, or let its "
        "DAG run"
    )
    bronze = missing_table("bronze.travel_sample_a8560dff_events", BUCKETS, [])
    assert "has not been ingested yet" in bronze and "run `dcp-cdc ingest` first" in bronze
    quality = missing_table("quality.travel_sample_a8560dff_results", BUCKETS, SILVER)
    assert "has not been checked yet" in quality and "`dcp-cdc check`" in quality


def test_another_buckets_tables_do_not_count() -> None:
    beer = ["silver.beer_sample_42d38c1b___default___default_all"]
    assert "has not been applied yet" in missing_table(LIVE, BUCKETS, beer)


def test_a_wrong_name_in_an_applied_bucket_suggests_the_closest() -> None:
    name = "silver.travel_sample_a8560dff__inventory__airlines"
    assert missing_table(name, BUCKETS, SILVER + BRONZE) == (
        f"{name}: no such table or view in the catalog; did you mean "
        "silver.travel_sample_a8560dff__inventory__airline or "
        "silver.travel_sample_a8560dff__inventory__airline_all? (`dcp-cdc tables` lists the "
        "7 there are)"
    )


def test_a_name_of_no_configured_bucket_is_a_wrong_name() -> None:
    name = "silver.travel_sample___default___default"  # the identifier lacks its suffix
    message = missing_table(name, BUCKETS, SILVER)
    assert message.startswith(f"{name}: no such table or view in the catalog; did you mean ")
    assert f"{LIVE} or" in message
    assert missing_table("silver.nothing_like_it", BUCKETS, SILVER) == (
        "silver.nothing_like_it: no such table or view in the catalog (`dcp-cdc tables` "
        "lists the 5 there are)"
    )


def test_a_bare_name_is_matched_to_the_qualified_ones() -> None:
    message = missing_table("travel_sample_a8560dff__inventory__airline", BUCKETS, SILVER)
    assert "did you mean silver.travel_sample_a8560dff__inventory__airline or" in message


def test_a_missing_database() -> None:
    assert missing_database("silver") == (
        "database silver does not exist yet: no bucket has been applied yet: run `dcp-cdc "
        "ingest` and `dcp-cdc apply` first, or let a bucket's DAG run"
    )
    assert missing_database("gold") == (
        "database gold does not exist: dcp-cdc's databases are bronze, silver, quality"
    )
