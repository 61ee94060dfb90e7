/* A workshop's start and end are typed as wall-clock time in the workshop's own zone (its
   Timezone field). Django's date shortcuts read the server's zone (TIME_ZONE) instead: "Today"
   gave the server's date, and each date input said the browser was hours ahead of or behind
   "server time", as if the times were typed in it. Loaded after DateTimeShortcuts.js, before
   it runs (on load). */
'use strict';
{
    const shortcuts = window.DateTimeShortcuts;
    const zone = () => {
        const chosen = document.getElementById('id_timezone');
        return chosen && chosen.value ? chosen.value : undefined;
    };
    // "Today" and the calendar's month: now where the workshop is held.
    shortcuts.now = function() {
        const now = new Date();
        let parts;
        try {
            parts = new Intl.DateTimeFormat('en-US', {
                timeZone: zone(), hourCycle: 'h23', year: 'numeric', month: 'numeric',
                day: 'numeric', hour: 'numeric', minute: 'numeric', second: 'numeric'
            }).formatToParts(now);
        } catch (error) {  // a zone this browser does not know: its own
            return now;
        }
        const part = (type) => Number(parts.find((p) => p.type === type).value);
        return new Date(
            part('year'), part('month') - 1, part('day'), part('hour'), part('minute'),
            part('second')
        );
    };
    // The times are not the server's: no word of "server time".
    shortcuts.addTimezoneWarning = function() {};
}
