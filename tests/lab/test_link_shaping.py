"""homagg.lab.shaping: the htb commands are Mininet TCLink's, for any rate, and they shape,
reshape and unshape a link in a namespace."""

from __future__ import annotations

import pytest

from homagg.lab.fabric import new_fabric_tag
from homagg.lab.namespace import add_namespace, delete_namespace, have_privileges, ip, tc
from homagg.lab.shaping import htb_commands, shape


def test_htb_commands_are_mininets_root_qdisc_and_class():
    qdisc, cls = htb_commands("hg1x0h0", 100)
    assert qdisc == ["qdisc", "add", "dev", "hg1x0h0", "root", "handle", "5:0", "htb",
                     "default", "1"]  # fmt: skip
    assert cls[-4:] == ["rate", "100Mbit", "burst", "15k"]
    assert cls[cls.index("parent") + 1] == "5:0" and cls[cls.index("classid") + 1] == "5:1"


def test_fractional_and_large_rates_keep_their_value():
    assert htb_commands("x", 2.5)[1][-3] == "2.5Mbit"
    assert htb_commands("x", 10000)[1][-3] == "10000Mbit"


@pytest.mark.parametrize("mbit", [0, -1, float("nan")])
def test_a_rate_that_is_not_positive_is_refused(mbit):
    with pytest.raises(ValueError, match="positive"):
        htb_commands("x", mbit)


@pytest.mark.skipif(not have_privileges(), reason="needs root and iproute2 (network namespaces)")
def test_shape_reshape_and_unshape_a_link_in_a_namespace():
    ns = f"{new_fabric_tag()}h0"  # a name of ours: homagg.lab.cleanup knows it
    add_namespace(ns)
    try:
        ip("link", "add", "d0", "type", "veth", "peer", "name", "d1", netns=ns)
        ip("link", "set", "d0", "up", netns=ns)
        shape(ns, "d0", 100)
        assert "rate 100Mbit" in tc("class", "show", "dev", "d0", netns=ns).stdout
        shape(ns, "d0", 1000)  # a shaped link takes a new rate
        assert "rate 1Gbit" in tc("class", "show", "dev", "d0", netns=ns).stdout
        shape(ns, "d0", 0)
        assert "htb" not in tc("qdisc", "show", "dev", "d0", netns=ns).stdout
        shape(ns, "d0", 0)  # unshaping an unshaped link is fine
    finally:
        delete_namespace(ns)
