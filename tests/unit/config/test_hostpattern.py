"""--limit's Ansible patterns (issue 39 item 11): `!` excludes, `&` intersects, `,` or `:` separate parts (a range's
`:` inside brackets stays a range)."""
import pytest

from clusterctl.config import hostpattern
from clusterctl.config.inventory import Host, Inventory
from clusterctl.errors import UserError


def inv() -> Inventory:
    hosts = tuple(Host(name=n, address=f"10.0.0.{i}", groups=g) for i, (n, g) in enumerate([
        ("gpu01", ("all", "train")), ("gpu02", ("all", "train", "rack_b")), ("gpu03", ("all", "train", "rack_b")),
        ("login", ("all", "infra"))]))
    return Inventory("inv.yaml", hosts, {"all": tuple(h.name for h in hosts), "train": ("gpu01", "gpu02", "gpu03"),
                                         "rack_b": ("gpu02", "gpu03"), "infra": ("login",)})


@pytest.mark.parametrize("pattern,want", [
    ("train,!gpu02", ["gpu01", "gpu03"]),
    ("train:!gpu02", ["gpu01", "gpu03"]),
    ("train:&rack_b", ["gpu02", "gpu03"]),
    ("train,&rack_b,!gpu03", ["gpu02"]),
    ("!login", ["gpu01", "gpu02", "gpu03"]),                # only exclusions: from every host
    ("all:!gpu0[2:3]", ["gpu01", "login"]),                 # a range's ':' is not a separator
    ("gpu0[1:3]:!rack_b", ["gpu01"]),
    ("train:!gpu*", []),
])
def test_ansible_exclusion_and_intersection(pattern, want):
    if want:
        assert [h.name for h in hostpattern.select(inv(), pattern)] == want
    else:
        with pytest.raises(UserError, match="leaves no host"):
            hostpattern.select(inv(), pattern)


@pytest.mark.parametrize("pattern", ["train,!gpu9", "train:&rackz", "!", "train,&"])
def test_a_part_that_names_nothing_is_still_an_error(pattern):
    with pytest.raises(UserError):
        hostpattern.select(inv(), pattern)
