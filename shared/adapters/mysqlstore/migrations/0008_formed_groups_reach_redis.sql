-- 0008: a FORMED group reaches Redis whoever records it (docs/design.md, Groups).
-- settled_at, on a FORMED group: Redis has been told it formed (group_form.lua
-- acknowledged), so no slot of it can reopen there. NULL: the sweeper tells it.
-- On a FAILED group it keeps its meaning: every member is cancelled.
-- The index serves the sweeper's list of groups whose end has not reached both
-- stores (status FORMED or FAILED, settled_at NULL) without reading the others.
ALTER TABLE group_buys
  ADD KEY group_buys_unsettled (status, settled_at);

-- Groups formed before this migration whose Redis keys are long gone (a group's
-- keys live until its deadline plus the hold retention, at most days): nothing
-- to tell Redis. Newer ones are told by the first sweep after the deploy.
UPDATE group_buys SET settled_at = COALESCE(formed_at, updated_at)
  WHERE status = 'FORMED' AND settled_at IS NULL AND deadline < NOW(3) - INTERVAL 30 DAY;
