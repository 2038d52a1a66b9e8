"""Issue 31, point 9: a peer's byte counters do not grow with every neighbour that ever
joined: at each new ring the departed neighbours' bytes fold into one ``former`` entry, and
the totals never go down."""

from __future__ import annotations

from pccl_aio._peer.observe.core.stats import FORMER, PeerStats


def test_departed_neighbours_fold_into_former_and_totals_stay():
    st = PeerStats()
    for newcomer in range(10, 110):  # 100 kill/replace cycles: a new neighbour each time
        st.moved([(newcomer, 100, 0), (2, 0, 50)])
        st.forget([1, 2])
    assert st.sent == {FORMER: 10_000}
    assert st.received == {2: 5_000}
    st.moved([(2, 7, 7)])
    st.forget([1])
    assert st.sent == {FORMER: 10_007} and st.received == {FORMER: 5_007}
