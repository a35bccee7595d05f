-- Argo CD health of an oculis.dev GPUUpstream. gopher-lua (Lua 5.1) with base and table only: no
-- string or math library, so argocd-cm needs no useOpenLibs. Conditions of an older generation than
-- metadata.generation are ignored, so a stale Ready never reads Healthy.
local hs = {}
local status = obj.status
local generation = obj.metadata.generation

if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Oculis operator to report status"
  return hs
end
if generation ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the Oculis operator to observe generation " .. tostring(generation)
  return hs
end

local function current(type)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type then
      if generation ~= nil and c.observedGeneration ~= nil and c.observedGeneration < generation then
        return nil
      end
      return c
    end
  end
  return nil
end

local function said(c, fallback)
  if c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local ready = current("Ready")
local degraded = current("Degraded")
local progressing = current("Progressing")

if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = said(degraded, degraded.reason)
  return hs
end
if ready ~= nil and ready.status == "False" and ready.reason == "ScaledToZero" then
  hs.status = "Suspended"
  hs.message = said(ready, "Scaled to zero")
  return hs
end
if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  hs.message = said(progressing, progressing.reason)
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = said(ready, "Ready")
  return hs
end
hs.status = "Progressing"
if ready ~= nil then
  hs.message = said(ready, ready.reason)
else
  hs.message = "Waiting for the Ready condition"
end
return hs
