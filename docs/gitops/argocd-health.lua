-- Argo CD health check for ballast.dev/InferenceService (docs/gitops.md).
--
-- Argo CD sets the global `obj` to the live object and reads `status` and `message`
-- from the table this returns. Written for Argo CD's Lua (5.1, with only the base and
-- table libraries open: no string or math functions), and tested with Lua 5.4 by
-- cli/tests/it/gitops.rs.

local function condition(status, kind)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

-- A condition written for an older generation is stale: the operator sets only the
-- conditions it has something to say about, and leaves the others as they were.
local function current(c, generation)
  return c ~= nil and (c.observedGeneration == nil or c.observedGeneration == generation)
end

local function explain(c)
  local reason = c.reason or ""
  local message = c.message or ""
  if reason ~= "" and message ~= "" then
    return reason .. ": " .. message
  end
  return reason .. message
end

local function assess(obj)
  local status = obj.status
  if status == nil then
    return "Progressing", "Waiting for the operator to write a status"
  end
  local generation = obj.metadata.generation
  local observed = status.observedGeneration
  if observed ~= generation then
    local seen = ""
    if observed ~= nil then
      seen = " (status is for " .. tostring(observed) .. ")"
    end
    return "Progressing", "Waiting for the operator to observe generation " ..
      tostring(generation) .. seen
  end

  local degraded = condition(status, "Degraded")
  if current(degraded, generation) and degraded.status == "True" then
    return "Degraded", explain(degraded)
  end

  local ready = condition(status, "Ready")
  if ready == nil then
    return "Progressing", "Waiting for the Ready condition"
  end
  local desired = status.desiredReplicas or 0
  local replicas = status.replicas or 0
  local readyReplicas = status.readyReplicas or 0
  if ready.status == "False" then
    if ready.reason == "ReplicasStarting" then
      return "Progressing", explain(ready)
    end
    if ready.reason == "NoReplicas" and desired == 0 then
      if replicas > 0 then
        return "Progressing", "Scaling to zero: " .. tostring(replicas) .. " replicas leaving"
      end
      return "Healthy", "Scaled to zero (desiredReplicas is 0)"
    end
    return "Degraded", explain(ready)
  end
  if ready.status ~= "True" then
    return "Progressing", explain(ready)
  end

  -- With autoscaling off the operator follows spec.replicas at its next control period.
  local spec = obj.spec or {}
  if spec.autoscaling ~= nil and spec.autoscaling.enabled == false and
      spec.replicas ~= nil and spec.replicas ~= desired then
    return "Progressing", "Waiting for the operator to follow spec.replicas " ..
      tostring(spec.replicas) .. " (desiredReplicas is " .. tostring(desired) .. ")"
  end
  if readyReplicas < desired then
    return "Progressing", "Scaling up: " .. tostring(readyReplicas) .. " of " ..
      tostring(desired) .. " replicas ready"
  end
  if replicas > desired then
    return "Progressing", tostring(replicas) .. " replicas for " .. tostring(desired) ..
      " desired: rolling out or draining"
  end

  local message = explain(ready)
  local scaling = condition(status, "ScalingActive")
  if current(scaling, generation) and scaling.status == "False" and
      scaling.reason ~= "AutoscalingDisabled" then
    message = message .. "; autoscaling holds: " .. explain(scaling)
  end
  return "Healthy", message
end

local hs = {}
hs.status, hs.message = assess(obj)
return hs
