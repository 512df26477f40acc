"""The run's budget as the server spends it (paramserver/tally.py's RunBudget)."""
from __future__ import annotations

from paramserver.tally import RunBudget, ServerTally


def test_the_windows_under_way_count_toward_the_budget_and_a_lost_clients_do_not():
    """Three clients, a budget of 12, windows of 2: after 8 minibatches in, with clients 1
    and 2 told to run a window each, client 0 is told to stop (8 + 2 + 2 = 12); had
    client 2 been lost, its window would not come, and client 0 goes on."""
    tally, budget = ServerTally(3), RunBudget(total=12, window=2)
    for client in range(3):
        budget.went(tally, client, 0)  # the first pulls: a window of n_fetch each
    for client, step in ((0, 2), (1, 2), (2, 2), (0, 4)):
        tally.stepped(client, step)
    budget.went(tally, 1, 0)
    budget.went(tally, 2, 0)
    assert tally.steps == 8 and not budget.spent(tally, 0, [0, 1]) and budget.spent(tally, 0, [0, 1, 2])
    tally.stepped(1, 3)  # a push halfway through its window: one minibatch of it still owed
    assert budget.spent(tally, 0, [0, 1, 2]) and not budget.spent(tally, 0, [0, 1])


def test_a_reply_window_overrides_n_fetch():
    """DyLU's reply gives the window: a client told to run 1 owes 1, not n_fetch."""
    tally, budget = ServerTally(2), RunBudget(total=6, window=4)
    tally.stepped(0, 4)
    budget.went(tally, 1, 1)
    assert not budget.spent(tally, 0, [0, 1])  # 4 in + 1 owed < 6
    budget.went(tally, 1, 2)
    assert budget.spent(tally, 0, [0, 1])       # 4 in + 2 owed = 6
